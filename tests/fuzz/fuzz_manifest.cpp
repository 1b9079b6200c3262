// libFuzzer target for the tuning-manifest parser (docs/fuzzing.md).
//
// Any input must either load as a manifest or throw a flexjit::Error (InputProperties.h); a
// violated property, any other exception (a JSON type error that escaped the checks), a
// sanitizer report or a hang is a bug: libFuzzer records the crash, and the input goes into
// tests/fuzz/manifest_corpus/ where test_fuzz_corpus.cpp replays it.
#include "InputProperties.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::string violation = flexjit::fuzz::manifest_property_violation(text);
  if (!violation.empty()) {
    std::fprintf(stderr, "manifest property violated: %s\n", violation.c_str());
    __builtin_trap();
  }
  return 0;
}
