// create_block_mask: a plan of one block_mask step (kernels/block_mask/BlockMaskBuild.h: the
// classify and index kernels of one module per mask structure and block size), tiles proven by
// host analysis skipped.
#include "runtime/CreateBlockMask.h"

#include <flexjit/error.h>

#include "Pipeline.h"
#include "binding/ModArgs.h"
#include "cpu/TileHints.h"
#include "device/MaskScheduleCache.h"
#include "flexjit_abi.h"
#include "kernels/block_mask/BlockMaskBuild.h"
#include "plan/ContextImpl.h"
#include "plan/Plan.h"
#include "runtime/BufferCheck.h"
#include "tune/StepTuner.h"

#include <fmt/format.h>

#include <deque>
#include <map>
#include <mutex>

namespace flexjit {

namespace {

constexpr size_t kMaxHintEntries = 32;

// Host-analysis results on the device, per (device, mask structure, parameter values, shape).
struct HintEntry {
  std::string key;
  size_t num_unknown = 0;
  size_t num_tiles = 0;
  std::unique_ptr<runtime::DeviceBuffer> hints, tiles, kinds;
};

// Process-wide and never destroyed: device memory must not be freed after the driver is gone.
struct Caches {
  std::mutex mu;
  std::deque<std::shared_ptr<HintEntry>> hints;  // most recent last
};
Caches& caches() {
  static Caches* c = new Caches();
  return *c;
}

std::shared_ptr<HintEntry> hints_for(Context& ctx, const Mods& mask, int batch, int heads,
                                     int seqlen_q, int seqlen_kv, int block_size,
                                     const std::map<std::string, double>& values, bool analysis) {
  runtime::Device& dev = *impl_of(ctx).device;
  std::string key = fmt::format("{}:{:x}:{}:{}:{}:{}:{}:{}", dev.index(), mask.hash(), batch, heads,
                                seqlen_q, seqlen_kv, block_size, analysis);
  for (const auto& [n, v] : values)
    key += fmt::format(":{}={}", n, v);
  Caches& c = caches();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    for (const auto& e : c.hints) {
      if (e->key == key) return e;
    }
  }
  auto e = std::make_shared<HintEntry>();
  e->key = key;
  const int nq = (seqlen_q + block_size - 1) / block_size;
  const int nkv = (seqlen_kv + block_size - 1) / block_size;
  e->num_tiles = static_cast<size_t>(nq) * nkv;
  e->num_unknown = e->num_tiles;
  if (analysis) {
    std::unordered_map<std::string, double> params(values.begin(), values.end());
    const cpu::TileHints h =
        cpu::analyze_tiles(lower_mods(mask), batch, heads, seqlen_q, seqlen_kv, block_size, params,
                           cpu::default_analysis_budget(nq, nkv));
    if (h.unknown.size() < e->num_tiles) {
      e->num_unknown = h.unknown.size();
      e->hints =
          std::make_unique<runtime::DeviceBuffer>(runtime::DeviceBuffer::from_host(dev, h.kinds));
      if (!h.unknown.empty()) {
        e->tiles = std::make_unique<runtime::DeviceBuffer>(
            runtime::DeviceBuffer::from_host(dev, h.unknown));
      }
    }
  }
  if (e->num_unknown > 0) {
    e->kinds = std::make_unique<runtime::DeviceBuffer>(
        dev, static_cast<size_t>(batch) * heads * e->num_tiles);
  }
  std::lock_guard<std::mutex> lock(c.mu);
  c.hints.push_back(e);
  if (c.hints.size() > kMaxHintEntries) c.hints.pop_front();
  return e;
}

void* ptr_of(const std::unique_ptr<runtime::DeviceBuffer>& b) {
  return b ? b->data() : nullptr;
}

// The options of the current create_block_mask_with call on this thread (create_block_mask,
// the friend of DeviceBlockMask, does the work; its public signature has no options).
thread_local runtime::BlockMaskBuildOptions t_options;

}  // namespace

namespace runtime {

DeviceBlockMask create_block_mask_with(Context& ctx, const Mods& mask, int batch, int heads,
                                       int seqlen_q, int seqlen_kv, int block_size,
                                       const ModBindings& bindings,
                                       const BlockMaskBuildOptions& options) {
  struct Restore {
    BlockMaskBuildOptions saved = t_options;
    ~Restore() { t_options = saved; }
  } restore;
  t_options = options;
  return create_block_mask(ctx, mask, batch, heads, seqlen_q, seqlen_kv, block_size, bindings);
}

}  // namespace runtime

DeviceBlockMask create_block_mask(Context& ctx, const Mods& mask, int batch, int heads,
                                  int seqlen_q, int seqlen_kv, int block_size,
                                  const ModBindings& bindings) {
  const runtime::BlockMaskBuildOptions& options = t_options;
  if (batch < 1 || heads < 1 || seqlen_q < 1 || seqlen_kv < 1 || block_size < 1) {
    throw RuntimeError(
        fmt::format("create_block_mask sizes must be positive: batch {}, heads {}, seqlen_q {}, "
                    "seqlen_kv {}, block size {}",
                    batch, heads, seqlen_q, seqlen_kv, block_size));
  }
  if (!mask.mask_mod.defined()) {
    throw CompileError("create_block_mask needs a mask_mod; these mods have none");
  }
  const int64_t nq = (static_cast<int64_t>(seqlen_q) + block_size - 1) / block_size;
  const int64_t nkv = (static_cast<int64_t>(seqlen_kv) + block_size - 1) / block_size;
  if (static_cast<int64_t>(batch) * heads * nq * nkv > (int64_t{1} << 31)) {
    throw RuntimeError(fmt::format("create_block_mask: {} x {} x {} x {} tiles is too many", batch,
                                   heads, nq, nkv));
  }
  // Names are checked before compiling, so a typo shows at once; bindings of buffers and params
  // that only the score_mod uses are left out.
  const Mods mask_mods = mask_only(mask);
  ContextImpl& impl = impl_of(ctx);
  const runtime::CallExtents extents{batch, heads, -1, seqlen_q, seqlen_kv};
  const runtime::BoundModArgs bound = runtime::bind_mod_args(
      mask_mods, bindings, TensorRef::Device::CUDA, impl.device->index(), &mask, &extents);
  const runtime::DeviceBufferCheck check(ctx, options.check_buffers, mask_mods, nullptr);
  kernels::BlockMaskInputs in;
  in.mod_params = runtime::pack_mod_params(mask_mods, bound, check.record());
  std::map<std::string, double> values;
  for (size_t i = 0; i < mask_mods.params.size(); ++i)
    values[mask_mods.params[i].name()] = bound.params[i];
  const std::shared_ptr<HintEntry> hints = hints_for(
      ctx, mask_mods, batch, heads, seqlen_q, seqlen_kv, block_size, values, options.host_analysis);

  DeviceBlockMask out;
  BlockMask& m = out.meta_;
  out.schedules_ = std::make_shared<runtime::MaskScheduleCache>(*impl_of(ctx).device);
  m.batch = batch;
  m.heads = heads;
  m.seqlen_q = seqlen_q;
  m.seqlen_kv = seqlen_kv;
  m.q_block_size = m.kv_block_size = block_size;
  m.num_q_blocks = static_cast<int>(nq);
  m.num_kv_blocks = static_cast<int>(nkv);
  m.mods = mask;
  const int64_t B = batch, H = heads;
  for (DeviceTensor* t : {&out.kv_num_blocks, &out.full_kv_num_blocks}) {
    *t = DeviceTensor::empty(ctx, DType::I32, {B, H, nq});
  }
  for (DeviceTensor* t : {&out.kv_indices, &out.full_kv_indices}) {
    *t = DeviceTensor::empty(ctx, DType::I32, {B, H, nq, nkv});
  }
  for (DeviceTensor* t : {&out.q_num_blocks, &out.full_q_num_blocks}) {
    *t = DeviceTensor::empty(ctx, DType::I32, {B, H, nkv});
  }
  for (DeviceTensor* t : {&out.q_indices, &out.full_q_indices}) {
    *t = DeviceTensor::empty(ctx, DType::I32, {B, H, nkv, nq});
  }
  auto i32 = [](const DeviceTensor& t) { return static_cast<int*>(t.ref().data); };
  FjBlockMaskBuildArgs& args = in.args;
  args.kv_num_blocks = i32(out.kv_num_blocks);
  args.kv_indices = i32(out.kv_indices);
  args.full_kv_num_blocks = i32(out.full_kv_num_blocks);
  args.full_kv_indices = i32(out.full_kv_indices);
  args.q_num_blocks = i32(out.q_num_blocks);
  args.q_indices = i32(out.q_indices);
  args.full_q_num_blocks = i32(out.full_q_num_blocks);
  args.full_q_indices = i32(out.full_q_indices);
  args.batch = batch;
  args.heads = heads;
  args.seqlen_q = seqlen_q;
  args.seqlen_kv = seqlen_kv;
  args.num_q_blocks = static_cast<int>(nq);
  args.num_kv_blocks = static_cast<int>(nkv);
  in.hints = ptr_of(hints->hints);
  in.tiles = ptr_of(hints->tiles);
  in.kinds = ptr_of(hints->kinds);
  in.num_unknown = static_cast<int64_t>(hints->num_unknown);

  runtime::Plan plan;
  // Tuned under FLEXJIT_AUTOTUNE (docs/tuning.md); the lengths only bucket the tuning key.
  kernels::InputFacts facts;
  facts.seqlen_q = seqlen_q;
  facts.seqlen_kv = seqlen_kv;
  tune::StepTuning tuning = tune::step_tuning(ctx, AutotuneMode::FromEnv, nullptr);
  if (check.on()) tuning = tune::lookup_only(tuning);  // checked kernels are not timed
  plan.add(runtime::plan_step<kernels::BlockMaskVariant>(
      kernels::block_mask_problem(cuda::Arch::parse(ctx.arch()), block_size, block_size), in, facts,
      mask, {}, {}, tuning));
  check.arm(plan);
  const runtime::BuiltPlan built = runtime::build_plan(impl.builder, plan);
  runtime::launch_plan(*impl.device, plan, built, nullptr, Workspace{});
  check.verify(mask_mods, bound);
  return out;
}

}  // namespace flexjit
