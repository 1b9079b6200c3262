#include "plan/Plan.h"

#include "device/CudaDriver.h"
#include "util/Log.h"

#include <fmt/format.h>

namespace flexjit::runtime {

namespace {

constexpr size_t kWorkspaceAlignment = 256;

size_t align_up(size_t n) {
  return (n + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// Device memory allocated and freed in stream order: nothing waits for it.
class StreamWorkspace {
 public:
  StreamWorkspace(size_t bytes, CuStream stream) : stream_(stream) {
    if (bytes == 0) return;
    FJ_CU(cuMemAllocAsync, fmt::format("a kernel workspace of {} bytes", bytes), &ptr_, bytes,
          stream_);
  }
  ~StreamWorkspace() {
    if (ptr_ != 0) Driver::get().cuMemFreeAsync_(ptr_, stream_);
  }
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;
  void* data() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr_)); }

 private:
  CUdeviceptr ptr_ = 0;
  CuStream stream_;
};

class NoTuning final : public Tuner {
 public:
  bool active() const override { return false; }
  CompletedStep complete(const kernels::KernelDesc& problem, const kernels::InputFacts& facts,
                         const Mods&, const kernels::Params& caller, std::string_view forced,
                         const StepIo&) const override {
    CompletedStep done;
    done.desc =
        kernels::Registry::global().complete(problem, facts, caller, forced, &done.selection);
    return done;
  }
};

}  // namespace

const Tuner& Tuner::none() {
  static const NoTuning none;
  return none;
}

kernels::Params below(const kernels::Params& caller, const kernels::Params& tuned) {
  kernels::Params out = tuned;
  for (const auto& [name, value] : caller.items())
    out.set(name, value);
  return out;
}

void Plan::add(PlanStep step) {
  step.workspace_offset = workspace_bytes;
  workspace_bytes += align_up(step.workspace_bytes);
  steps.push_back(std::move(step));
}

std::string Plan::str() const {
  std::string s;
  for (const PlanStep& st : steps) {
    if (!s.empty()) s += '\n';
    s += fmt::format("{} (workspace {} bytes)", st.desc.str(), st.workspace_bytes);
  }
  return s;
}

BuiltPlan build_plan(KernelBuilder& builder, const Plan& plan) {
  // The steps' kernels are independent: build_all compiles the new ones concurrently (a cold
  // backward costs its dK/dV compile, not the sum of three; docs/caching.md).
  std::vector<BuildRequest> requests;
  requests.reserve(plan.steps.size());
  for (const PlanStep& step : plan.steps)
    requests.push_back({&step.mods, &step.desc});
  BuiltPlan built;
  built.kernels = builder.build_all(requests);
  return built;
}

void launch_plan(Device& device, const Plan& plan, const BuiltPlan& built, CuStream stream,
                 const Workspace& given) {
  FJ_ASSERT(built.kernels.size() == plan.steps.size(), "a plan launched with another's kernels");
  device.make_current();
  std::unique_ptr<StreamWorkspace> owned;
  char* ws = nullptr;
  if (plan.workspace_bytes > 0) {
    if (given.data != nullptr) {
      if (given.bytes < plan.workspace_bytes) {
        throw RuntimeError(fmt::format(
            "the workspace given has {} bytes; this call needs {} (flex_attention_workspace_bytes "
            "says how much)",
            given.bytes, plan.workspace_bytes));
      }
      ws = static_cast<char*>(given.data);
    } else {
      owned = std::make_unique<StreamWorkspace>(plan.workspace_bytes, stream);
      ws = static_cast<char*>(owned->data());
    }
  }
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const PlanStep& step = plan.steps[i];
    const PlanStep& owner = step.workspace_of >= 0 ? plan.steps.at(step.workspace_of) : step;
    FJ_ASSERT(step.workspace_of < static_cast<int>(i), "a step reads a later step's workspace");
    void* step_ws = owner.workspace_bytes > 0 ? ws + owner.workspace_offset : nullptr;
    for (kernels::Launch& l : step.launches(step_ws)) {
      // The step's own module, or the companion's the launch names (Variant::companions).
      const std::vector<BuiltKernel>& companions = built.kernels[i].companions;
      FJ_ASSERT(l.companion < static_cast<int>(companions.size()),
                "a launch of a companion kernel its step was not built with");
      const jit::CompiledKernel& ck =
          *(l.companion < 0 ? built.kernels[i] : companions[l.companion]).compiled.kernel;
      const Kernel kernel = ModuleCache::global().get(ck.key, ck.cubin, l.entry_point, ck.label);
      FJ_LOG("runtime", "launch {}: grid ({}, {}, {}) block {} smem {} ({})", step.desc.str(),
             l.grid.x, l.grid.y, l.grid.z, l.block.x, l.smem_bytes,
             jit::to_string(built.kernels[i].compiled.outcome));
      if (l.before) l.before(stream);
      if (l.zero_bytes > 0) {
        FJ_CU(cuMemsetD8Async, "zeroing a kernel's work counter",
              reinterpret_cast<CUdeviceptr>(l.zero_first), 0, l.zero_bytes, stream);
      }
      launch(kernel, l.grid, l.block, l.smem_bytes, stream, l.args.pointers(), l.programmatic);
      if (l.after) l.after(stream);
    }
  }
}

}  // namespace flexjit::runtime
