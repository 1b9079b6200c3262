// Replays the parser fuzz corpus (tests/fuzz/corpus: seeds and every crash the fuzzer found) and
// every standard mod through the fuzz target's property ([fuzz]). A crash reproducer dropped
// into tests/fuzz/corpus becomes a regression test here with no other change.
#include "fuzz/ParserProperty.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace fs = std::filesystem;

TEST_CASE("every input of the fuzz corpus and every standard mod keeps the parser property",
          "[fuzz]") {
  int inputs = 0;
  for (const char* sub : {"tests/fuzz/corpus", "dsl"}) {
    for (const auto& e : fs::recursive_directory_iterator(fs::path(FLEXJIT_SOURCE_DIR) / sub)) {
      if (!e.is_regular_file()) continue;
      INFO(e.path().string());
      std::ifstream in(e.path(), std::ios::binary);
      std::string text{std::istreambuf_iterator<char>(in), {}};
      CHECK(flexjit::fuzz::parser_property_violation(text) == "");
      ++inputs;
    }
  }
  CHECK(inputs >= 20);
}
