#include "cpu/JitBlockMask.h"

#include "binding/ModArgs.h"
#include "codegen/llvm/CpuModParams.h"
#include "codegen/llvm/LlvmCodegen.h"
#include "cpu/ParallelFor.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace flexjit::cpu {

BlockMask cpu_create_block_mask(const Mods& mods, const ModBindings& bindings, int64_t batch,
                                int64_t heads, int64_t q_len, int64_t kv_len,
                                const CpuBlockMaskOptions& options) {
  constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();
  if (batch < 1 || heads < 1 || q_len < 0 || kv_len < 0) {
    throw RuntimeError(fmt::format(
        "create_block_mask: batch {} and heads {} must be >= 1, q_len {} and kv_len {} >= 0", batch,
        heads, q_len, kv_len));
  }
  if (batch > kMaxIndex || heads > kMaxIndex || q_len > kMaxIndex || kv_len > kMaxIndex) {
    throw RuntimeError("create_block_mask: sizes must fit the mods' i32 indices");
  }
  if (options.q_block < 1 || options.kv_block < 1) {
    throw RuntimeError(fmt::format("create_block_mask: block sizes {}x{} must be >= 1",
                                   options.q_block, options.kv_block));
  }
  // The mask_mod with only what it reads; the bindings are checked against all of `mods`.
  Mods mask_only;
  runtime::BoundModArgs bound;
  if (mods.mask_mod.defined()) {
    mask_only = flexjit::mask_only(mods);
    const runtime::CallExtents extents{batch, heads, -1, q_len, kv_len};
    bound = runtime::bind_mod_args(mask_only, bindings, TensorRef::Device::CPU, 0, &mods, &extents);
  } else {
    mask_only.name = mods.name;
    runtime::bind_mod_args(mods, bindings, TensorRef::Device::CPU);
  }

  BlockMask m;
  m.batch = static_cast<int>(batch);
  m.heads = static_cast<int>(heads);
  m.seqlen_q = static_cast<int>(q_len);
  m.seqlen_kv = static_cast<int>(kv_len);
  m.q_block_size = options.q_block;
  m.kv_block_size = options.kv_block;
  const int64_t nq64 = (q_len + m.q_block_size - 1) / m.q_block_size;
  const int64_t nkv = (kv_len + m.kv_block_size - 1) / m.kv_block_size;
  m.num_q_blocks = static_cast<int>(nq64);
  m.num_kv_blocks = static_cast<int>(nkv);
  m.mods = mods;
  const int64_t rows = batch * heads * nq64;
  if (rows > 0 && nkv > 0 && rows > std::numeric_limits<int64_t>::max() / 4 / nkv) {
    throw RuntimeError(fmt::format("create_block_mask: {} x {} x {} x {} tiles is too many", batch,
                                   heads, nq64, nkv));
  }
  m.kv_num_blocks.assign(static_cast<size_t>(rows), 0);
  m.full_kv_num_blocks.assign(static_cast<size_t>(rows), 0);
  m.kv_indices.assign(static_cast<size_t>(rows * nkv), 0);
  m.full_kv_indices.assign(static_cast<size_t>(rows * nkv), 0);
  if (rows > 0 && nkv > 0) {
    const llvmjit::CpuModFunctions fns = llvmjit::compile_cpu_mods(mask_only);
    const std::vector<uint64_t> params = llvmjit::pack_cpu_mod_params(mask_only, bound);
    parallel_for(rows, resolve_threads(options.num_threads), [&](int64_t row, int) {
      const int64_t qb = row % nq64;
      const int64_t bh = row / nq64;
      const auto b = static_cast<int32_t>(bh / heads);
      const auto h = static_cast<int32_t>(bh % heads);
      const auto q0 = static_cast<int32_t>(qb * m.q_block_size);
      const auto q1 = static_cast<int32_t>(std::min<int64_t>(q_len, q0 + int64_t{m.q_block_size}));
      int32_t* part = m.kv_indices.data() + row * nkv;
      int32_t* full = m.full_kv_indices.data() + row * nkv;
      int32_t np = 0, nf = 0;
      for (int64_t kb = 0; kb < nkv; ++kb) {
        const auto kv0 = static_cast<int32_t>(kb * m.kv_block_size);
        const auto kv1 =
            static_cast<int32_t>(std::min<int64_t>(kv_len, kv0 + int64_t{m.kv_block_size}));
        int32_t cls = fns.mask_tile(params.data(), b, h, q0, q1, kv0, kv1);
        // Positions past the end count as masked (BlockMask's convention, PyTorch's padding):
        // a cut tile is never full.
        if (cls == llvmjit::kTileFull &&
            (q1 - q0 < m.q_block_size || kv1 - kv0 < m.kv_block_size)) {
          cls = llvmjit::kTilePartial;
        }
        if (cls == llvmjit::kTilePartial) {
          part[np++] = static_cast<int32_t>(kb);
        } else if (cls == llvmjit::kTileFull) {
          full[nf++] = static_cast<int32_t>(kb);
        }
      }
      m.kv_num_blocks[static_cast<size_t>(row)] = np;
      m.full_kv_num_blocks[static_cast<size_t>(row)] = nf;
      // The unused entries: the other tiles ascending (BlockMask's layout, as PyTorch's argsort
      // leaves them).
      for (int32_t* idx : {part, full}) {
        const int32_t n = idx == part ? np : nf;
        int32_t next = n, j = 0;
        for (int32_t kb = 0; kb < static_cast<int32_t>(nkv); ++kb) {
          if (j < n && idx[j] == kb) {
            ++j;
          } else {
            idx[next++] = kb;
          }
        }
      }
    });
  }
  m.build_transposed();
  return m;
}

}  // namespace flexjit::cpu
