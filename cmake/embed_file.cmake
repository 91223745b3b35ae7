# cmake -DINPUT=<file> -DOUTPUT=<file.cc> -DSYMBOL=<name> -DHEADER=<include> -P embed_file.cmake
# Writes a C++ source defining `nezha::cuda::${SYMBOL}` (the file's bytes) and `${SYMBOL}Size`, for
# the reduction kernels' fatbin (core/src/cuda/kernel_image.h).
file(READ "${INPUT}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# A line break every 32 bytes keeps the generated file readable by editors and compilers alike.
string(REGEX REPLACE "((0x..,){32})" "\\1\n" bytes "${bytes}")
get_filename_component(name "${INPUT}" NAME)
file(WRITE "${OUTPUT}" "// Generated from ${name} by cmake/embed_file.cmake at build time; do not edit.
#include \"${HEADER}\"

namespace nezha::cuda {

// cuModuleLoadData reads the image in place: keep it aligned like a heap block.
alignas(64) const unsigned char ${SYMBOL}[] = {
${bytes}
};
const size_t ${SYMBOL}Size = sizeof(${SYMBOL});

}  // namespace nezha::cuda
")
