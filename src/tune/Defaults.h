// Default block configurations per (arch, dtype, head dim), as Inductor's flex_attention
// lowering keeps a table of them. The autotuner (src/tune/) searches around these.
#pragma once

#include "codegen/cuda/ForwardSpec.h"

namespace flexjit::tune {

cuda::ForwardConfig default_forward_config(const cuda::ForwardSpec& spec);

}  // namespace flexjit::tune
