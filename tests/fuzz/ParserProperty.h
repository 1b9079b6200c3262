// The property the `.fx` parser must have on any input, shared by the libFuzzer target
// (fuzz_parser.cpp) and the regression test over tests/fuzz/corpus (test_fuzz_corpus.cpp).
#pragma once

#include <flexjit/error.h>
#include <flexjit/mods.h>

#include <string>

namespace flexjit::fuzz {

// Any input must either parse or throw a flexjit::Error (a CompileError with a location);
// whatever parses must print (Mods::to_text()) as text that parses back to equal mods with an
// equal hash. Returns "" when that holds, else what broke. Any other exception (an InternalError
// from a broken FJ_ASSERT, std::bad_alloc, ...) propagates: that is a bug as well.
inline std::string parser_property_violation(const std::string& text) {
  Mods m;
  try {
    m = parse_mods(text, "fuzz.fx");
  } catch (const Error&) {
    return {};
  }
  std::string printed = m.to_text();
  Mods again;
  try {
    again = parse_mods(printed, "roundtrip.fx");
  } catch (const Error& e) {
    return "the printed mods do not parse back:\n" + printed + "\n" + e.what();
  }
  if (!equal(m, again)) return "the printed mods parse back to different mods:\n" + printed;
  if (m.hash() != again.hash()) return "the printed mods parse back with another hash:\n" + printed;
  return {};
}

}  // namespace flexjit::fuzz
