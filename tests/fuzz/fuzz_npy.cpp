// libFuzzer target for the `.npy` reader (docs/fuzzing.md).
//
// Any input must either read as an array or throw a flexjit::Error, and what reads must write
// back as a file that reads the same (InputProperties.h). A violated property, any other
// exception, a sanitizer report, a huge allocation or a hang is a bug: libFuzzer records the
// crash, and the input goes into tests/fuzz/npy_corpus/ where test_fuzz_corpus.cpp replays it.
#include "InputProperties.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  std::string violation = flexjit::fuzz::npy_property_violation(bytes);
  if (!violation.empty()) {
    std::fprintf(stderr, ".npy property violated: %s\n", violation.c_str());
    __builtin_trap();
  }
  return 0;
}
