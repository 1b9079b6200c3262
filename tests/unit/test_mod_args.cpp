// One validator for mod bindings (binding/ModArgs.h, bind_mod_args): the GPU packer, the CPU
// packer, both block-mask builders on the host and the CPU forward reject the same mistakes with
// the same message.
#include <flexjit/attention.h>
#include <flexjit/cpu.h>
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "binding/ModArgs.h"
#include "codegen/llvm/CpuModParams.h"
#include "cpu/InterpretedBlockMask.h"
#include "cpu/JitBlockMask.h"
#include "support/CliPath.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace flexjit;

namespace {

alignas(16) char g_fake[4096];  // never dereferenced by the GPU packer (it copies pointers)

// A tensor for `device`; host tensors point at real (zeroed) memory.
TensorRef tensor(DType dt, std::vector<int64_t> shape, TensorRef::Device device) {
  return TensorRef::contiguous(g_fake, dt, std::move(shape), device, 0);
}

struct BindingCase {
  const char* what;
  const char* mods;  // .fx text; every mask_mod reads what the case is about
  std::function<ModBindings(TensorRef::Device)> bindings;
  const char* message;
};

const char* kMods =
    "buffer bias: f32[H]\nbuffer table: i32[8]\nparam window: i32\nparam flag: bool = true\n"
    "mask_mod = flag && q_idx - kv_idx <= window + table[q_idx % 8] && bias[h] > -1.0";

ModBindings good(TensorRef::Device d) {
  ModBindings b;
  b.buffers = {{"bias", tensor(DType::F32, {4}, d)}, {"table", tensor(DType::I32, {8}, d)}};
  b.params = {{"window", 16}};
  return b;
}

template <typename F>
std::function<ModBindings(TensorRef::Device)> changed(F f) {
  return [f](TensorRef::Device d) {
    ModBindings b = good(d);
    f(b, d);
    return b;
  };
}

const std::vector<BindingCase>& cases() {
  using D = TensorRef::Device;
  static const std::vector<BindingCase> c = {
      {"unknown param", kMods, changed([](ModBindings& b, D) {
         b.params.push_back({"windw", 1});
       }),
       "a value is given for param 'windw', which the mods '<inline>' do not declare (their "
       "params: window, flag)"},
      {"unknown buffer", kMods, changed([](ModBindings& b, D d) {
         b.buffers.push_back({"bais", tensor(DType::F32, {4}, d)});
       }),
       "a tensor is bound to buffer 'bais', which the mods '<inline>' do not declare (their "
       "buffers: bias, table)"},
      {"repeated param", kMods, changed([](ModBindings& b, D) {
         b.params.push_back({"window", 3});
       }),
       "param 'window' is given twice"},
      {"repeated buffer", kMods, changed([](ModBindings& b, D d) {
         b.buffers.push_back({"bias", tensor(DType::F32, {4}, d)});
       }),
       "buffer 'bias' is bound twice"},
      {"unbound buffer", kMods, changed([](ModBindings& b, D) { b.buffers.pop_back(); }),
       "buffer 'table' (i32[8]) is not bound"},
      {"dtype", kMods,
       changed([](ModBindings& b, D d) { b.buffers[0].second = tensor(DType::F16, {4}, d); }),
       "buffer 'bias' (declared f32[H]) is bound to a f16 tensor; expected f32"},
      {"rank", kMods, changed([](ModBindings& b, D d) {
         b.buffers[0].second = tensor(DType::F32, {4, 1}, d);
       }),
       "buffer 'bias' (declared f32[H]) is bound to a tensor of 2 dims; expected 1"},
      {"numeric extent", kMods,
       changed([](ModBindings& b, D d) { b.buffers[1].second = tensor(DType::I32, {9}, d); }),
       "buffer 'table' (declared i32[8]): dim 0 has extent 9; the declaration says 8"},
      {"negative extent", kMods, changed([](ModBindings& b, D d) {
         b.buffers[0].second.shape = {-2};
         (void)d;
       }),
       "buffer 'bias' (declared f32[H]): dim 0 has negative extent -2"},
      {"device", kMods, changed([](ModBindings& b, D d) {
         b.buffers[0].second.device = d == D::CPU ? D::CUDA : D::CPU;
       }),
       "buffer 'bias' (declared f32[H]) is on"},
      {"null data", kMods, changed([](ModBindings& b, D) { b.buffers[0].second.data = nullptr; }),
       "buffer 'bias' (declared f32[H]) has a null data pointer"},
      {"param without default", kMods, changed([](ModBindings& b, D) { b.params.clear(); }),
       "param 'window' (i32) has no default value"},
      {"i32 not an integer", kMods, changed([](ModBindings& b, D) { b.params[0].second = 2.5; }),
       "param 'window' is i32, but its value 2.5 is not an integer in the i32 range"},
      {"i32 out of range", kMods, changed([](ModBindings& b, D) { b.params[0].second = 3e9; }),
       "param 'window' is i32, but its value 3"},
      {"bool not 0 or 1", kMods, changed([](ModBindings& b, D) {
         b.params.push_back({"flag", 2});
       }),
       "param 'flag' is bool, but its value 2 is not 0 or 1"},
  };
  return c;
}

}  // namespace

TEST_CASE("good bindings pass every path", "[modargs][cpu]") {
  const Mods mods = parse_mods(kMods);
  std::memset(g_fake, 0, sizeof g_fake);
  CHECK_NOTHROW(runtime::pack_mod_params(mods, good(TensorRef::Device::CUDA), 0));
  CHECK_NOTHROW(llvmjit::pack_cpu_mod_params(mods, good(TensorRef::Device::CPU)));
  CHECK_NOTHROW(cpu::cpu_create_block_mask(mods, good(TensorRef::Device::CPU), 1, 1, 64, 64));
  CHECK_NOTHROW(
      cpu::build_block_mask_interpreted(mods, 1, 1, 64, 64, 32, good(TensorRef::Device::CPU)));
}

TEST_CASE("every binding error is the same error on the GPU and CPU paths", "[modargs][cpu]") {
  const Mods mods = parse_mods(kMods);
  std::vector<float> x(2 * 16 * 8, 0.5f);
  const TensorRef q = TensorRef::contiguous(x.data(), DType::F32, {1, 2, 16, 8});
  for (const BindingCase& c : cases()) {
    INFO(c.what);
    const ModBindings gpu = c.bindings(TensorRef::Device::CUDA);
    const ModBindings host = c.bindings(TensorRef::Device::CPU);
    // The GPU forward's packer (the GPU create_block_mask checks through the same function).
    CHECK_THROWS_WITH(runtime::pack_mod_params(mods, gpu, 0), Catch::Contains(c.message));
    // The CPU backend: its packer, its JIT block-mask builder, the interpreted builder (`flexjit
    // mask show`), and flex_attention_cpu (`flexjit run --device cpu`).
    CHECK_THROWS_WITH(llvmjit::pack_cpu_mod_params(mods, host), Catch::Contains(c.message));
    CHECK_THROWS_WITH(cpu::cpu_create_block_mask(mods, host, 1, 2, 16, 16),
                      Catch::Contains(c.message));
    CHECK_THROWS_WITH(cpu::build_block_mask_interpreted(mods, 1, 2, 16, 16, 8, host),
                      Catch::Contains(c.message));
    AttentionOptions opts;
    opts.mods = mods;
    opts.bindings = host;
    CHECK_THROWS_WITH(flex_attention_cpu(q, q, q, opts), Catch::Contains(c.message));
  }
}

TEST_CASE("block masks skip score_mod bindings but still catch typos", "[modargs][mask]") {
  const Mods mods = parse_mods(
      "buffer bias: f32[H]\nparam cap: f32 = 30.0\nparam window: i32\n"
      "score_mod = cap * tanh(score / cap) + bias[h]\nmask_mod = q_idx - kv_idx <= window");
  const Mods mask = mask_only(mods);
  REQUIRE(mask.buffers.empty());
  REQUIRE(mask.params.size() == 1);
  const TensorRef bias = TensorRef::contiguous(g_fake, DType::F32, {4}, TensorRef::Device::CUDA, 0);
  ModBindings b;
  b.buffers = {{"bias", bias}};
  b.params = {{"cap", 10.0}, {"window", 7}};
  const runtime::BoundModArgs bound =
      runtime::bind_mod_args(mask, b, TensorRef::Device::CUDA, 0, &mods);
  CHECK(bound.params == std::vector<double>{7.0});
  const std::vector<uint64_t> words = runtime::pack_mod_params(mask, bound);
  int32_t window = 0;
  std::memcpy(&window, words.data(), 4);
  CHECK(window == 7);
  // Binding the score_mod's buffer to the mask part alone is the error a typo gets.
  CHECK_THROWS_WITH(runtime::bind_mod_args(mask, b, TensorRef::Device::CUDA),
                    Catch::Contains("buffer 'bias', which the mods"));
  // The CPU builders take the whole Mods: a host-bound score_mod buffer is not needed at all.
  ModBindings host;
  host.params = {{"window", 7}};
  CHECK_NOTHROW(cpu::cpu_create_block_mask(mods, host, 1, 1, 32, 32));
  CHECK_NOTHROW(cpu::build_block_mask_interpreted(mods, 1, 1, 32, 32, 16, host));
  host.params.push_back({"windw", 1});
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { runtime::bind_mod_args(mask, host, TensorRef::Device::CUDA, 0, &mods); },
           [&] { cpu::cpu_create_block_mask(mods, host, 1, 1, 32, 32); },
           [&] { cpu::build_block_mask_interpreted(mods, 1, 1, 32, 32, 16, host); }}) {
    CHECK_THROWS_WITH(call(), Catch::Contains("param 'windw', which the mods"));
  }
}

TEST_CASE("the CLI's CPU paths reject unknown and repeated names as the GPU path does",
          "[modargs][cli]") {
  std::string out;
  const std::string unknown = "a value is given for param 'windw', which the mods";
  CHECK(test::run_cli("run --device cpu --mods sliding_window --param windw=16 --random 1,1,64,16 "
                      "--repeat 0",
                      &out) == 1);
  CHECK_THAT(out, Catch::Contains(unknown));
  CHECK(test::run_cli("mask show --cpu --mask-mod sliding_window --param windw=16 --seqlen 256",
                      &out) == 1);
  CHECK_THAT(out, Catch::Contains(unknown));
  CHECK(test::run_cli("mask show --cpu --mask-mod sliding_window --param window=16 --param "
                      "window=32 --seqlen 256",
                      &out) == 1);
  CHECK_THAT(out, Catch::Contains("param 'window' is given twice"));
  CHECK(test::run_cli("run --device cpu --mods causal --buffer slopes=/nonexistent.npy --random "
                      "1,1,64,16 --repeat 0",
                      &out) == 1);
  CHECK_THAT(out, Catch::Contains("/nonexistent.npy: cannot open"));
  // The right name works on both.
  CHECK(test::run_cli("run --device cpu --mods sliding_window --param window=16 --random "
                      "1,1,64,16 --repeat 0",
                      &out) == 0);
  CHECK(test::run_cli("mask show --cpu --mask-mod sliding_window --param window=16 --seqlen 256",
                      &out) == 0);
}
