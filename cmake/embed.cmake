# cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed.cmake: a C file defining the bytes of IN
# as `const unsigned char NAME[]` and its length as `const unsigned long NAME_len`.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR n "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n"
  bytes "${bytes}")
file(WRITE ${OUT} "/* Generated from ${IN} by cmake/embed.cmake. */\n"
  "extern const unsigned char ${NAME}[];\nextern const unsigned long ${NAME}_len;\n"
  "__attribute__((aligned(8))) const unsigned char ${NAME}[] = {\n${bytes}\n};\n"
  "const unsigned long ${NAME}_len = ${n};\n")
