# library.cmake — the packaged library, built from tsobjs_pic: the objects of tscore compiled
# again as position-independent code, every symbol hidden but the TS_API functions of
# include/twinstack.h (ts_objects() in CMakeLists.txt):
#   libtwinstack.so  SONAME libtwinstack.so.TS_API_MAJOR; the version script exports ts_* only,
#                    a second fence behind the hidden visibility.
#   libtwinstack.a   one prelinked object (ld -r), hidden symbols made local (objcopy
#                    --localize-hidden): its only global definitions are the API, so lwIP's
#                    tcp_new or our log_init never collide with a program's own symbols.
#   twinstack.pc     written at install time, so `cmake --install --prefix DIR` gets DIR's paths.
# `cmake --install` puts the header, both libraries and the .pc under GNUInstallDirs.

include(GNUInstallDirs)

file(STRINGS ${CMAKE_SOURCE_DIR}/include/twinstack.h _ts_major REGEX "^#define TS_API_MAJOR [0-9]+$")
string(REGEX REPLACE "^#define TS_API_MAJOR ([0-9]+)$" "\\1" TS_API_MAJOR "${_ts_major}")
if(NOT TS_API_MAJOR MATCHES "^[0-9]+$")
  message(FATAL_ERROR "TS_API_MAJOR not found in include/twinstack.h")
endif()

ts_objects(tsobjs_pic)
set_target_properties(tsobjs_pic PROPERTIES POSITION_INDEPENDENT_CODE ON)

# --- shared ----------------------------------------------------------------------------------
set(TS_VERSION_SCRIPT ${CMAKE_SOURCE_DIR}/cmake/twinstack.map)
add_library(twinstack_shared SHARED)
target_link_libraries(twinstack_shared PRIVATE tsobjs_pic)
set_target_properties(twinstack_shared PROPERTIES
  OUTPUT_NAME twinstack VERSION ${PROJECT_VERSION} SOVERSION ${TS_API_MAJOR}
  LINK_DEPENDS ${TS_VERSION_SCRIPT})
# -z defs: every symbol the library uses comes from a library it names (its NEEDED list is then
# what twinstack.pc must require); --as-needed: and nothing more. (Sanitizer runtimes resolve
# their symbols from the executable: no -z defs there.)
target_link_options(twinstack_shared PRIVATE -Wl,--version-script=${TS_VERSION_SCRIPT}
  -Wl,--as-needed)
if(TS_SANITIZE STREQUAL "" AND NOT TS_FUZZ)
  target_link_options(twinstack_shared PRIVATE -Wl,-z,defs)
endif()

# --- static: one relocatable object --------------------------------------------------------
set(TS_STATIC_LIB ${CMAKE_BINARY_DIR}/libtwinstack.a)
set(_ts_prelinked ${CMAKE_BINARY_DIR}/twinstack-prelink/twinstack.o)
add_custom_command(OUTPUT ${TS_STATIC_LIB}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/twinstack-prelink
  COMMAND ${CMAKE_LINKER} -r -o ${_ts_prelinked} "$<TARGET_OBJECTS:tsobjs_pic>"
  COMMAND ${CMAKE_OBJCOPY} --localize-hidden ${_ts_prelinked}
  COMMAND ${CMAKE_COMMAND} -E rm -f ${TS_STATIC_LIB}
  COMMAND ${CMAKE_AR} rcs ${TS_STATIC_LIB} ${_ts_prelinked}
  DEPENDS tsobjs_pic "$<TARGET_OBJECTS:tsobjs_pic>"
  COMMAND_EXPAND_LISTS VERBATIM
  COMMENT "Prelinking libtwinstack.a (ld -r, objcopy --localize-hidden)")
add_custom_target(twinstack_static ALL DEPENDS ${TS_STATIC_LIB})

# --- install ---------------------------------------------------------------------------------
install(FILES ${CMAKE_SOURCE_DIR}/include/twinstack.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS twinstack_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${TS_STATIC_LIB} DESTINATION ${CMAKE_INSTALL_LIBDIR})
# twinstack.pc.in -> twinstack.pc.tmpl now (everything but the prefix; libdir and includedir
# relative to ${prefix} unless GNUInstallDirs made them absolute) -> twinstack.pc at install
# time, when the prefix (`cmake --install --prefix DIR`) is known.
foreach(_d LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_d}}")
    set(TS_PC_${_d} "${CMAKE_INSTALL_${_d}}")
  else()
    set(TS_PC_${_d} "\${prefix}/${CMAKE_INSTALL_${_d}}")
  endif()
endforeach()
# What the objects call (libevent's core, cJSON, libcap, c-ares, PCRE2, libbpf): keep in step
# with the .so's NEEDED list. OpenSSL and nghttp2 are not in it: core/tlslib.c opens them when needed.
set(TS_PC_REQUIRES_PRIVATE "libevent libcjson libcap libcares libpcre2-8 libbpf")
set(prefix "@prefix@")
configure_file(${CMAKE_SOURCE_DIR}/cmake/twinstack.pc.in ${CMAKE_BINARY_DIR}/twinstack.pc.tmpl @ONLY)
unset(prefix)
set(_ts_pc ${CMAKE_BINARY_DIR}/pkgconfig-install/twinstack.pc)
install(CODE "
  set(prefix \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${CMAKE_BINARY_DIR}/twinstack.pc.tmpl\" \"${_ts_pc}\" @ONLY)
")
install(FILES ${_ts_pc} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
