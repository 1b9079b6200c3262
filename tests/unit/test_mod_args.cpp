// create_block_mask's use of the FjModParams packer: bindings of the mask_mod's part of a Mods.
#include <flexjit/attention.h>
#include <flexjit/error.h>

#include <flexjit/mods.h>
#include "runtime/ModArgs.h"

#include <catch2/catch.hpp>

#include <cstring>

using namespace flexjit;

TEST_CASE("mask-only bindings drop score_mod names and still catch typos", "[modargs][mask]") {
  const Mods mods = parse_mods(
      "buffer bias: f32[H]\nparam cap: f32 = 30.0\nparam window: i32\n"
      "score_mod = cap * tanh(score / cap) + bias[h]\nmask_mod = q_idx - kv_idx <= window");
  const Mods mask = mask_only(mods);
  REQUIRE(mask.buffers.empty());
  REQUIRE(mask.params.size() == 1);
  alignas(16) static char fake[16];  // never dereferenced: the packer copies pointers only
  const TensorRef bias = TensorRef::contiguous(fake, DType::F32, {4}, TensorRef::Device::CUDA, 0);
  ModBindings b;
  b.buffers = {{"bias", bias}};
  b.params = {{"cap", 10.0}, {"window", 7}};
  const ModBindings part = runtime::bindings_of_part(mods, mask, b);
  CHECK(part.buffers.empty());
  REQUIRE(part.params.size() == 1);
  CHECK(part.params[0].first == "window");
  const runtime::BoundModArgs bound = runtime::bind_mod_args(mask, part, 0);
  CHECK(bound.params == std::vector<double>{7.0});
  const std::vector<uint64_t> words = runtime::pack_mod_params(mask, bound);
  int32_t window = 0;
  std::memcpy(&window, words.data(), 4);
  CHECK(window == 7);
  // Binding the score_mod's buffer to the mask part alone is the error a typo gets.
  CHECK_THROWS_WITH(runtime::bind_mod_args(mask, b, 0),
                    Catch::Contains("buffer 'bias', which the mods"));
  b.params.push_back({"windw", 1});
  CHECK_THROWS_WITH(runtime::bindings_of_part(mods, mask, b),
                    Catch::Contains("param 'windw', which the mods"));
  CHECK_THROWS_WITH(runtime::bind_mod_args(mask, {{}, {{"window", 1.5}}}, 0),
                    Catch::Contains("not an integer"));
}
