// create_block_mask on a real GPU against the interpreted builder (cpu/InterpretedBlockMask.h),
// with and without the host analysis. Without a GPU the tests report "skipped: no GPU (<reason>)".
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "cpu/InterpretedBlockMask.h"
#include "device/Device.h"
#include "runtime/CreateBlockMask.h"

#include <catch2/catch.hpp>

#include "support/BlockMaskCompare.h"
#include "support/HostBindings.h"

#include <array>

using namespace flexjit;

namespace {

bool have_gpu() {
  std::string reason;
  if (runtime::cuda_available(&reason)) return true;
  WARN("skipped: no GPU (" << reason << ")");
  return false;
}

}  // namespace

TEST_CASE("create_block_mask equals the CPU builder for every standard mask", "[gpu][mask]") {
  if (!have_gpu()) return;
  Context ctx;
  const std::vector<std::array<int, 3>> shapes = {
      {1024, 1024, 128}, {1000, 900, 128}, {777, 1500, 64}, {300, 300, 512}, {4096, 4096, 128}};
  for (const std::string& name : standard_mod_names()) {
    const Mods m = standard_mods(name);
    if (!m.mask_mod.defined()) continue;
    for (const auto& [sq, skv, block] : shapes) {
      const int S = std::max(sq, skv);
      std::vector<int32_t> ids(static_cast<size_t>(S));
      for (int i = 0; i < S; ++i)
        ids[static_cast<size_t>(i)] = i / 300 + (i % 1000 == 999);
      DeviceTensor dev_ids = DeviceTensor::from_host(ctx, DType::I32, {S}, ids.data());
      ModBindings bindings;
      ir::EvalEnv env;
      for (const Buffer& b : m.buffers) {
        if (b.decl()->name != "doc_id") continue;
        bindings.buffers.emplace_back("doc_id", dev_ids.ref());
        env.buffers["doc_id"] = ir::BufferView{ids.data(), DType::I32, {S}, {}};
      }
      for (const Param& p : m.params) {
        const double v = p.decl()->name == "dilation" ? 3 : 200;
        bindings.params.emplace_back(p.decl()->name, v);
        env.params[p.decl()->name] = v;
      }
      const BlockMask want =
          cpu::build_block_mask_interpreted(m, 1, 1, sq, skv, block, test::host_bindings(m, env));
      for (bool analysis : {true, false}) {
        INFO(name << " Sq=" << sq << " Skv=" << skv << " block=" << block
                  << " analysis=" << analysis);
        const DeviceBlockMask got =
            runtime::create_block_mask_with(ctx, m, 1, 1, sq, skv, block, bindings, {analysis});
        const BlockMask host = got.to_host();
        host.validate();
        test::require_same(host, want);
      }
    }
  }
}

TEST_CASE("create_block_mask follows b and h and broadcasts 1", "[gpu][mask][small]") {
  if (!have_gpu()) return;
  Context ctx;
  const Mods m =
      parse_mods("param shift: i32 = 100\nmask_mod = q_idx - kv_idx >= h * shift - b * 250");
  for (const auto& [B, H] : std::vector<std::pair<int, int>>{{2, 3}, {1, 4}, {3, 1}, {1, 1}}) {
    INFO("B=" << B << " H=" << H);
    ir::EvalEnv env;
    env.params["shift"] = 90;
    const BlockMask want =
        cpu::build_block_mask_interpreted(m, B, H, 1300, 1100, 128, test::host_bindings(m, env));
    const DeviceBlockMask got = create_block_mask(ctx, m, B, H, 1300, 1100, 128,
                                                  {.buffers = {}, .params = {{"shift", 90}}});
    CHECK(got.meta().batch == B);
    CHECK(got.meta().heads == H);
    CHECK(got.kv_indices.ref().shape == std::vector<int64_t>{B, H, 11, 9});
    test::require_same(got.to_host(), want);
  }
}

TEST_CASE("create_block_mask reports bad input", "[gpu][mask]") {
  if (!have_gpu()) return;
  Context ctx;
  CHECK_THROWS_AS(create_block_mask(ctx, standard_mods("alibi"), 1, 1, 128, 128), CompileError);
  CHECK_THROWS_WITH(create_block_mask(ctx, standard_mods("causal"), 0, 1, 128, 128),
                    Catch::Contains("must be positive"));
  CHECK_THROWS_WITH(create_block_mask(ctx, standard_mods("document"), 1, 1, 128, 128),
                    Catch::Contains("buffer 'doc_id' (i32[S]) is not bound"));
  CHECK_THROWS_WITH(create_block_mask(ctx, standard_mods("causal"), 1, 1, 128, 128, 128,
                                      {.buffers = {}, .params = {{"window", 3}}}),
                    Catch::Contains("param 'window', which the mods 'causal' do not declare"));
  std::vector<int32_t> host(128);
  const TensorRef on_cpu = TensorRef::contiguous(host.data(), DType::I32, {128});
  CHECK_THROWS_WITH(create_block_mask(ctx, standard_mods("document"), 1, 1, 128, 128, 128,
                                      {.buffers = {{"doc_id", on_cpu}}, .params = {}}),
                    Catch::Contains("is on cpu"));
}
