// libFuzzer target for the `.fx` parser (docs/fuzzing.md).
//
// Any input must either parse or throw a flexjit::Error, and what parses must round-trip
// (ParserProperty.h). A violated property, an InternalError (a broken FJ_ASSERT), any other
// exception, a sanitizer report, a stack overflow or a hang is a bug: libFuzzer records the
// crash, and the input goes into tests/fuzz/corpus/ where test_fuzz_corpus.cpp replays it.
#include "ParserProperty.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::string violation = flexjit::fuzz::parser_property_violation(text);
  if (!violation.empty()) {
    std::fprintf(stderr, "parser property violated: %s\n", violation.c_str());
    __builtin_trap();
  }
  return 0;
}
