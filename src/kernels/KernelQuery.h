// The complete kernel description of a public KernelQuery (include/flexjit/kernel.h): the
// family's problem, the variant selected by the registry, its config resolved. What the CLI's
// emit / compile / inspect / bench --compile build.
#pragma once

#include <flexjit/kernel.h>

#include "kernels/Registry.h"

namespace flexjit::kernels {

KernelDesc desc_for_query(const KernelQuery& query, Selection* selection = nullptr);

}  // namespace flexjit::kernels
