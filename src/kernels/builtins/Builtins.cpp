// flexjit's own kernel families and variants, registered in Families::global() and
// Registry::global() on their first use. Adding a variant: its template(s) in templates/, its
// class (kernels/<family>/<Variant>.{h,cpp}), and one line in register_builtin_variants; adding a
// family: its folder, its templates, its id (KernelDesc.h) and one line in
// register_builtin_families (docs/kernels/README.md).
#include "cp/MergeKernel.h"
#include "kernels/Family.h"
#include "kernels/Registry.h"
#include "kernels/backward/Backward.h"
#include "kernels/backward/Sm80Backward.h"
#include "kernels/backward/Sm90Backward.h"
#include "kernels/block_mask/BlockMaskBuild.h"
#include "kernels/decode/Decode.h"
#include "kernels/decode/DecodeCombine.h"
#include "kernels/decode/DecodeSplit.h"
#include "kernels/forward/Forward.h"
#include "kernels/forward/Sm80Mma.h"
#include "kernels/forward/Sm90Wgmma.h"
#include "kernels/forward_companions/Fp8Transpose.h"
#include "kernels/forward_companions/UnionSchedule.h"

namespace flexjit::kernels {

// In plan order within a workload kind (Families::of_kind).
void register_builtin_families(Families& families) {
  families.add(forward_family());
  families.add(block_mask_family());
  families.add(backward_preprocess_family());
  families.add(backward_dkdv_family());
  families.add(backward_dq_family());
  families.add(decode_split_family());
  families.add(decode_combine_family());
  families.add(cp::cp_merge_family());
  families.add(forward_schedule_family());
  families.add(forward_fp8_vt_family());
}

void register_builtin_variants(Registry& registry) {
  registry.add(std::make_unique<ForwardSm80Mma>());
  registry.add(std::make_unique<ForwardSm90Wgmma>());
  registry.add(std::make_unique<BlockMaskWarpPerTile>());
  registry.add(std::make_unique<BackwardPreprocessSm80>());
  registry.add(std::make_unique<BackwardDkDvSm80Mma>());
  registry.add(std::make_unique<BackwardDqSm80Mma>());
  registry.add(std::make_unique<BackwardDqAtomicConvert>());
  registry.add(std::make_unique<BackwardDkDvSm90Wgmma>());
  registry.add(std::make_unique<BackwardDqSm90Wgmma>());
  registry.add(std::make_unique<DecodeSplitSm80Mma>());
  registry.add(std::make_unique<DecodeSplitSm80Mma>(1));  // sm80_ef (experimental)
  registry.add(std::make_unique<DecodeSplitSm80Mma>(2));  // sm80_ef256 (experimental)
  registry.add(std::make_unique<DecodeCombineWarpPerRow>());
  registry.add(std::make_unique<DecodeCombineWarpPerRow>(true));  // warp_batched (the default)
  registry.add(std::make_unique<cp::MergeWarpPerRow>());
  registry.add(std::make_unique<UnionScheduleBlockPerTile>());
  registry.add(std::make_unique<Fp8VtBlockPer64Keys>());
}

}  // namespace flexjit::kernels
