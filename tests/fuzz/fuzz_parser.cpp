// libFuzzer target for the `.fx` parser (docs/fuzzing.md).
//
// Any input must either parse or throw a flexjit::Error (a CompileError with a location). An
// InternalError (a broken FJ_ASSERT), any other exception, a sanitizer report, a stack overflow
// or a hang is a bug: the exception escapes and libFuzzer records the crash.
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "ir/IR.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  flexjit::Mods m;
  try {
    m = flexjit::parse_mods(text, "fuzz.fx");
  } catch (const flexjit::Error&) {
    return 0;
  }
  // Whatever parses must print as text that parses back to equal mods (a parse error here is a
  // bug too: it escapes as an uncaught exception).
  flexjit::Mods again = flexjit::parse_mods(m.to_text(), "roundtrip.fx");
  if (!flexjit::equal(m, again) || m.hash() != again.hash()) __builtin_trap();
  return 0;
}
