// Replays the parser fuzz corpus (tests/fuzz/corpus: seeds and every crash the fuzzer found) and
// every standard mod through the fuzz target's property, and the .npy and manifest corpora
// (tests/fuzz/npy_corpus, tests/fuzz/manifest_corpus) through theirs ([fuzz]). A crash reproducer
// dropped into a corpus directory becomes a regression test here with no other change.
#include "fuzz/InputProperties.h"
#include "fuzz/ParserProperty.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

namespace {

// Every regular file under FLEXJIT_SOURCE_DIR/sub, as (path, bytes).
std::vector<std::pair<std::string, std::string>> corpus(const char* sub) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(FLEXJIT_SOURCE_DIR) / sub)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    out.emplace_back(e.path().string(), std::string{std::istreambuf_iterator<char>(in), {}});
  }
  return out;
}

}  // namespace

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

TEST_CASE("every input of the .npy and manifest fuzz corpora keeps its reader's property",
          "[fuzz]") {
  const auto npy = corpus("tests/fuzz/npy_corpus");
  CHECK(npy.size() >= 9);
  for (const auto& [path, bytes] : npy) {
    INFO(path);
    CHECK(flexjit::fuzz::npy_property_violation(bytes) == "");
  }
  const auto manifests = corpus("tests/fuzz/manifest_corpus");
  CHECK(manifests.size() >= 4);
  for (const auto& [path, text] : manifests) {
    INFO(path);
    CHECK(flexjit::fuzz::manifest_property_violation(text) == "");
  }
  // The seeds are valid inputs (a fuzzer starting from errors only explores less).
  CHECK_NOTHROW(flexjit::npy::parse(npy.front().second, npy.front().first));
}
