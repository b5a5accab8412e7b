// A C++ application embedding a model compiled by kiln as a library named "tiny" (one input,
// one output), built against the static or the shared library through pkg-config or CMake:
//   c++ embed_model.cpp $(PKG_CONFIG_PATH=DIR pkg-config --cflags --libs tiny)
//   tests/cmake/CMakeLists.txt: find_package(tiny CONFIG REQUIRED), kiln::tiny
// Usage: embed_model IN.bin OUT.bin OUT_BYTES
// Reads the raw little-endian input, runs the model on two threads and writes the output.
// Including the C header from C++ and linking its unmangled names checks its extern "C" block.
#include "tiny.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace {

struct CtxDeleter {
  void operator()(tiny_ctx *ctx) const { tiny_destroy(ctx); }
};
using Ctx = std::unique_ptr<tiny_ctx, CtxDeleter>;

}  // namespace

int main(int argc, char **argv) {
  static_assert(TINY_NUM_INPUTS == 1 && TINY_NUM_OUTPUTS == 1, "one input, one output");
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s IN.bin OUT.bin OUT_BYTES\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<char> input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.is_open() || input.empty()) {
    std::fprintf(stderr, "cannot read %s\n", argv[1]);
    return 1;
  }
  std::vector<char> output(std::strtoul(argv[3], nullptr, 10));
  Ctx ctx(tiny_create(2));
  if (!ctx) {
    std::fprintf(stderr, "tiny_create: %s\n", tiny_last_error(nullptr));
    return 1;
  }
  std::string info = tiny_info();
  if (info.find("\"inputs\"") == std::string::npos) {
    std::fprintf(stderr, "tiny_info() lacks the inputs: %s\n", info.c_str());
    return 1;
  }
  const void *ins[] = {input.data()};
  void *outs[] = {output.data()};
  if (tiny_run_generic(ctx.get(), ins, outs) != 0) {
    std::fprintf(stderr, "tiny_run_generic: %s\n", tiny_last_error(ctx.get()));
    return 1;
  }
  std::ofstream out(argv[2], std::ios::binary);
  out.write(output.data(), static_cast<std::streamsize>(output.size()));
  return out.good() ? 0 : 1;
}
