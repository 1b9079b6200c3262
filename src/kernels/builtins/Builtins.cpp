// flexjit's own kernel variants, registered in Registry::global() on its first use. Adding a
// variant: its template(s) in templates/, its class (kernels/<family>/<Variant>.{h,cpp}), and
// one line here (docs/kernels/README.md).
#include "kernels/Registry.h"
#include "kernels/backward/Sm80Backward.h"
#include "kernels/backward/Sm90Backward.h"
#include "kernels/block_mask/BlockMaskBuild.h"
#include "kernels/decode/DecodeCombine.h"
#include "kernels/decode/DecodeSplit.h"
#include "kernels/forward/Sm80Mma.h"
#include "kernels/forward/Sm90Wgmma.h"

namespace flexjit::kernels {

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
}

}  // namespace flexjit::kernels
