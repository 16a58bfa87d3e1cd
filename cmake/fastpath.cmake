# The system stack's in-kernel fast path (stacks/system/fastpath.bpf.c): compiled for the BPF
# target by clang, then built into the library as a byte array (cmake/embed.cmake) that
# stacks/system/fastpath.c hands to libbpf.
find_program(TS_BPF_CLANG NAMES clang clang-14 REQUIRED)
# Optional: the object's DWARF dropped (its BTF, which libbpf needs, stays).
find_program(TS_BPF_STRIP NAMES llvm-strip llvm-strip-14)
pkg_check_modules(LIBBPF REQUIRED IMPORTED_TARGET libbpf>=1.0)
execute_process(COMMAND ${CMAKE_C_COMPILER} -print-multiarch OUTPUT_VARIABLE TS_MULTIARCH
  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
set(TS_BPF_SRC ${CMAKE_SOURCE_DIR}/stacks/system/fastpath.bpf.c)
set(TS_BPF_OBJ ${CMAKE_BINARY_DIR}/fastpath.bpf.o)
set(TS_BPF_EMBED ${CMAKE_BINARY_DIR}/fastpath_obj.c)
set(TS_BPF_INCLUDES -I${CMAKE_SOURCE_DIR}/stacks/system ${LIBBPF_CFLAGS})
if(TS_MULTIARCH)
  list(APPEND TS_BPF_INCLUDES -I/usr/include/${TS_MULTIARCH})
endif()
set(TS_BPF_STRIP_CMD "")
if(TS_BPF_STRIP)
  set(TS_BPF_STRIP_CMD COMMAND ${TS_BPF_STRIP} -g ${TS_BPF_OBJ})
endif()
add_custom_command(OUTPUT ${TS_BPF_OBJ}
  COMMAND ${TS_BPF_CLANG} -O2 -g -Wall -Werror -target bpf
    -fdebug-prefix-map=${CMAKE_SOURCE_DIR}=. ${TS_BPF_INCLUDES}
    -c ${TS_BPF_SRC} -o ${TS_BPF_OBJ}
  ${TS_BPF_STRIP_CMD}
  DEPENDS ${TS_BPF_SRC} ${CMAKE_SOURCE_DIR}/stacks/system/fastpath_abi.h
  COMMENT "BPF object fastpath.bpf.o" VERBATIM)
add_custom_command(OUTPUT ${TS_BPF_EMBED}
  COMMAND ${CMAKE_COMMAND} -DIN=${TS_BPF_OBJ} -DOUT=${TS_BPF_EMBED} -DNAME=ts_fastpath_obj
    -P ${CMAKE_SOURCE_DIR}/cmake/embed.cmake
  DEPENDS ${TS_BPF_OBJ} ${CMAKE_SOURCE_DIR}/cmake/embed.cmake
  COMMENT "Embedding fastpath.bpf.o" VERBATIM)
# One target makes them: every object library that compiles the generated file depends on it,
# so parallel builds never write them twice at once.
add_custom_target(ts_fastpath_obj DEPENDS ${TS_BPF_EMBED})
