# lwip.cmake — the lwIP 2.1.3 sources (Debian's source package, fetched by scripts/setup.sh into
# build/deps/lwip, never committed or modified), compiled into tscore with our own lwipopts.h.
#
# Its Filelists.cmake is READ, not included: including it would configure_file() into the
# fetched source tree and add a Doxygen target. Only the lwipcore*_SRCS lists are used.
# Third-party code: compiled with -w (no warnings, so our -Werror never applies to it).
# Sets TS_LWIP_SRCS and TS_LWIP_INCLUDES.

set(TS_LWIP_DIR "${CMAKE_SOURCE_DIR}/build/deps/lwip" CACHE PATH "lwIP source (scripts/setup.sh)")
if(NOT EXISTS "${TS_LWIP_DIR}/src/Filelists.cmake")
  message(FATAL_ERROR "lwIP source not found in ${TS_LWIP_DIR}: run scripts/setup.sh")
endif()

file(READ "${TS_LWIP_DIR}/src/Filelists.cmake" _ts_lwip_lists)
set(TS_LWIP_SRCS "")
foreach(_var lwipcore_SRCS lwipcore4_SRCS lwipcore6_SRCS)
  string(REGEX MATCH "set\\(${_var}([^)]*)\\)" _m "${_ts_lwip_lists}")
  if(NOT _m)
    message(FATAL_ERROR "lwIP: ${_var} not found in ${TS_LWIP_DIR}/src/Filelists.cmake")
  endif()
  string(REGEX REPLACE "[ \t\r\n]+" ";" _l "${CMAKE_MATCH_1}")
  foreach(_f ${_l})
    if(_f)
      string(REPLACE "\${LWIP_DIR}" "${TS_LWIP_DIR}" _f "${_f}")
      list(APPEND TS_LWIP_SRCS "${_f}")
    endif()
  endforeach()
endforeach()

# Our include dir first: lwipopts.h, arch/cc.h, lwip_hooks.h. Never /usr/include/lwip (a
# liblwip-dev package ships its own lwipopts.h and arch/cc.h).
set(TS_LWIP_INCLUDES ${CMAKE_SOURCE_DIR}/stacks/lwip/include ${TS_LWIP_DIR}/src/include)
set_source_files_properties(${TS_LWIP_SRCS} PROPERTIES COMPILE_OPTIONS "-w")
