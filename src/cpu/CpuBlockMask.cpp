#include "cpu/CpuBlockMask.h"

#include "codegen/llvm/CpuModParams.h"
#include "codegen/llvm/LlvmCodegen.h"
#include "cpu/ThreadPool.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace flexjit::cpu {

void CpuBlockMask::validate() const {
  if (batch < 1 || heads < 1 || q_len < 0 || kv_len < 0 || q_block < 1 || kv_block < 1) {
    throw RuntimeError(fmt::format(
        "block mask has invalid sizes: batch {}, heads {}, q_len {}, kv_len {}, blocks {}x{}",
        batch, heads, q_len, kv_len, q_block, kv_block));
  }
  const int64_t nq = (q_len + q_block - 1) / q_block;
  const int64_t nkv = (kv_len + kv_block - 1) / kv_block;
  if (num_q_blocks != nq || num_kv_blocks != nkv) {
    throw RuntimeError(fmt::format(
        "block mask has {}x{} tiles but q_len {} / kv_len {} with {}x{} blocks need {}x{}",
        num_q_blocks, num_kv_blocks, q_len, kv_len, q_block, kv_block, nq, nkv));
  }
  const size_t rows = static_cast<size_t>(batch * heads * nq);
  const size_t cells = rows * static_cast<size_t>(nkv);
  auto check = [&](const char* what, const std::vector<int32_t>& counts,
                   const std::vector<int32_t>& indices) {
    if (counts.size() != rows || indices.size() != cells) {
      throw RuntimeError(fmt::format("block mask {} arrays have {} / {} entries, expected {} / {}",
                                     what, counts.size(), indices.size(), rows, cells));
    }
    for (size_t r = 0; r < rows; ++r) {
      if (counts[r] < 0 || counts[r] > nkv) {
        throw RuntimeError(fmt::format("block mask {}num_blocks[{}] = {} is outside [0, {}]", what,
                                       r, counts[r], nkv));
      }
      for (int32_t k = 0; k < counts[r]; ++k) {
        const int32_t i = indices[r * nkv + k];
        if (i < 0 || i >= nkv || (k > 0 && i <= indices[r * nkv + k - 1])) {
          throw RuntimeError(fmt::format(
              "block mask {}indices row {} entry {} = {} is out of range or not ascending", what, r,
              k, i));
        }
      }
    }
  };
  check("kv_", kv_num_blocks, kv_indices);
  check("full_kv_", full_kv_num_blocks, full_kv_indices);
}

CpuBlockMask cpu_create_block_mask(const Mods& mods, const ir::EvalEnv& bindings, int64_t batch,
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
  Mods mask_only;
  mask_only.mask_mod = mods.mask_mod;
  mask_only.buffers = mods.buffers;
  mask_only.params = mods.params;
  mask_only.name = mods.name;

  CpuBlockMask m;
  m.batch = batch;
  m.heads = heads;
  m.q_len = q_len;
  m.kv_len = kv_len;
  m.q_block = options.q_block;
  m.kv_block = options.kv_block;
  m.num_q_blocks = (q_len + m.q_block - 1) / m.q_block;
  m.num_kv_blocks = (kv_len + m.kv_block - 1) / m.kv_block;
  const int64_t rows = batch * heads * m.num_q_blocks;
  const int64_t nkv = m.num_kv_blocks;
  m.kv_num_blocks.assign(static_cast<size_t>(rows), 0);
  m.full_kv_num_blocks.assign(static_cast<size_t>(rows), 0);
  m.kv_indices.assign(static_cast<size_t>(rows * nkv), 0);
  m.full_kv_indices.assign(static_cast<size_t>(rows * nkv), 0);
  if (rows == 0 || nkv == 0) return m;

  const llvmjit::CpuModFunctions fns = llvmjit::compile_cpu_mods(mask_only);
  const std::vector<uint64_t> params = llvmjit::pack_cpu_mod_params(mask_only, bindings);
  parallel_for(rows, resolve_threads(options.num_threads), [&](int64_t row, int) {
    const int64_t qb = row % m.num_q_blocks;
    const int64_t bh = row / m.num_q_blocks;
    const auto b = static_cast<int32_t>(bh / heads);
    const auto h = static_cast<int32_t>(bh % heads);
    const auto q0 = static_cast<int32_t>(qb * m.q_block);
    const auto q1 = static_cast<int32_t>(std::min<int64_t>(q_len, q0 + int64_t{m.q_block}));
    int32_t partial = 0, full = 0;
    for (int64_t kb = 0; kb < nkv; ++kb) {
      const auto kv0 = static_cast<int32_t>(kb * m.kv_block);
      const auto kv1 = static_cast<int32_t>(std::min<int64_t>(kv_len, kv0 + int64_t{m.kv_block}));
      const int32_t cls = fns.mask_tile(params.data(), b, h, q0, q1, kv0, kv1);
      if (cls == llvmjit::kTilePartial) {
        m.kv_indices[static_cast<size_t>(row * nkv + partial++)] = static_cast<int32_t>(kb);
      } else if (cls == llvmjit::kTileFull) {
        m.full_kv_indices[static_cast<size_t>(row * nkv + full++)] = static_cast<int32_t>(kb);
      }
    }
    m.kv_num_blocks[static_cast<size_t>(row)] = partial;
    m.full_kv_num_blocks[static_cast<size_t>(row)] = full;
  });
  return m;
}

}  // namespace flexjit::cpu
