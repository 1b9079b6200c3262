#include <flexjit/block_mask.h>
#include <flexjit/error.h>

#include "flexjit_abi.h"
#include "ir/Operators.h"
#include "runtime/BlockMaskGeometry.h"
#include "util/CheckedMath.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace flexjit {

namespace {

int ceil_div(int a, int b) {
  return static_cast<int>(runtime::block_count(a, b));
}

BlockMask empty_geometry(int batch, int heads, int seqlen_q, int seqlen_kv, int q_block_size,
                         int kv_block_size) {
  runtime::check_block_mask_geometry(batch, heads, seqlen_q, seqlen_kv, q_block_size,
                                     kv_block_size);
  BlockMask m;
  m.batch = batch;
  m.heads = heads;
  m.seqlen_q = seqlen_q;
  m.seqlen_kv = seqlen_kv;
  m.q_block_size = q_block_size;
  m.kv_block_size = kv_block_size;
  m.num_q_blocks = ceil_div(seqlen_q, q_block_size);
  m.num_kv_blocks = ceil_div(seqlen_kv, kv_block_size);
  return m;
}

// Writes one row of (count, indices): the selected indices ascending, then the others
// ascending, as PyTorch's argsort(descending, stable) of the dense block mask produces (kernels
// that prefetch one index past the count read a valid index).
void write_row(const std::vector<bool>& selected, int32_t* count, int32_t* indices) {
  int n = 0;
  for (size_t j = 0; j < selected.size(); ++j) {
    if (selected[j]) indices[n++] = static_cast<int32_t>(j);
  }
  *count = n;
  for (size_t j = 0; j < selected.size(); ++j) {
    if (!selected[j]) indices[n++] = static_cast<int32_t>(j);
  }
}

// Builds the transposed (count, indices) arrays of one kind from the forward ones.
void transpose(const BlockMask& m, const std::vector<int32_t>& num, const std::vector<int32_t>& idx,
               std::vector<int32_t>& tnum, std::vector<int32_t>& tidx) {
  const int nq = m.num_q_blocks, nkv = m.num_kv_blocks;
  tnum.assign(static_cast<size_t>(m.batch) * m.heads * nkv, 0);
  tidx.assign(static_cast<size_t>(m.batch) * m.heads * nkv * nq, 0);
  for (int bh = 0; bh < m.batch * m.heads; ++bh) {
    // sel[kvb][qb]
    std::vector<std::vector<bool>> sel(nkv, std::vector<bool>(nq, false));
    for (int qb = 0; qb < nq; ++qb) {
      const size_t row = static_cast<size_t>(bh) * nq + qb;
      for (int i = 0; i < num[row]; ++i)
        sel[idx[row * nkv + i]][qb] = true;
    }
    for (int kvb = 0; kvb < nkv; ++kvb) {
      const size_t row = static_cast<size_t>(bh) * nkv + kvb;
      write_row(sel[kvb], &tnum[row], tidx.data() + row * nq);  // no [] on an empty array
    }
  }
}

std::string index_str(std::initializer_list<int64_t> idx) {
  std::string s;
  for (int64_t i : idx)
    s += (s.empty() ? "" : ", ") + std::to_string(i);
  return s;
}

// Checks one (count, indices) pair of arrays of shape [Bm, Hm, rows] / [Bm, Hm, rows, cols].
void validate_arrays(const BlockMask& m, const std::vector<int32_t>& num,
                     const std::vector<int32_t>& idx, int rows, int cols, const char* num_name,
                     const char* idx_name) {
  const size_t nrows = static_cast<size_t>(m.batch) * m.heads * rows;
  if (num.size() != nrows) {
    throw RuntimeError(fmt::format("{} has {} elements; expected {} ([{}, {}, {}])", num_name,
                                   num.size(), nrows, m.batch, m.heads, rows));
  }
  if (idx.size() != nrows * cols) {
    throw RuntimeError(fmt::format("{} has {} elements; expected {} ([{}, {}, {}, {}])", idx_name,
                                   idx.size(), nrows * cols, m.batch, m.heads, rows, cols));
  }
  for (int b = 0; b < m.batch; ++b) {
    for (int h = 0; h < m.heads; ++h) {
      for (int r = 0; r < rows; ++r) {
        const size_t row = (static_cast<size_t>(b) * m.heads + h) * rows + r;
        const int count = num[row];
        if (count < 0 || count > cols) {
          throw RuntimeError(fmt::format("{}[{}] = {} is outside [0, {}]", num_name,
                                         index_str({b, h, r}), count, cols));
        }
        for (int i = 0; i < count; ++i) {
          const int v = idx[row * cols + i];
          if (v < 0 || v >= cols) {
            throw RuntimeError(fmt::format("{}[{}] = {} is out of range [0, {})", idx_name,
                                           index_str({b, h, r, i}), v, cols));
          }
          if (i > 0 && v <= idx[row * cols + i - 1]) {
            throw RuntimeError(fmt::format("{}[{}] = {} is not above the previous index {}",
                                           idx_name, index_str({b, h, r, i}), v,
                                           idx[row * cols + i - 1]));
          }
        }
      }
    }
  }
}

BlockMask combine_tiles(const BlockMask& a, const BlockMask& b, const char* op,
                        TileKind (*rule)(TileKind, TileKind)) {
  if (a.seqlen_q != b.seqlen_q || a.seqlen_kv != b.seqlen_kv || a.q_block_size != b.q_block_size ||
      a.kv_block_size != b.kv_block_size) {
    throw RuntimeError(fmt::format(
        "{}: masks differ in sequence lengths or block sizes: {}x{} in {}x{} tiles vs {}x{} in "
        "{}x{} tiles",
        op, a.seqlen_q, a.seqlen_kv, a.q_block_size, a.kv_block_size, b.seqlen_q, b.seqlen_kv,
        b.q_block_size, b.kv_block_size));
  }
  auto merge_dim = [&](int x, int y, const char* what) {
    if (x != y && x != 1 && y != 1) {
      throw RuntimeError(fmt::format("{}: masks differ in {} ({} vs {}); each must be equal or 1",
                                     op, what, x, y));
    }
    return std::max(x, y);
  };
  const int batch = merge_dim(a.batch, b.batch, "batch");
  const int heads = merge_dim(a.heads, b.heads, "heads");
  return block_mask_from_tiles(
      batch, heads, a.seqlen_q, a.seqlen_kv,
      [&](int bi, int hi, int qb, int kvb) {
        return rule(a.tile(bi, hi, qb, kvb), b.tile(bi, hi, qb, kvb));
      },
      a.q_block_size, a.kv_block_size);
}

// The Mods of a combined mask: unknown (undefined mask_mod) if either side's is.
Mods combine_mods(const BlockMask& a, const BlockMask& b, ir::Op op) {
  if (!a.mods.mask_mod.defined() || !b.mods.mask_mod.defined()) return Mods{};
  Mods m = combine(a.mods, b.mods);  // unites buffers / params; ANDs the mask_mods
  if (op == ir::Op::Or) m.mask_mod = ir::build_binary(ir::Op::Or, a.mods.mask_mod, b.mods.mask_mod);
  return m;
}

}  // namespace

TileKind BlockMask::tile(int b, int h, int qb, int kvb) const {
  FJ_ASSERT(qb >= 0 && qb < num_q_blocks && kvb >= 0 && kvb < num_kv_blocks,
            "BlockMask::tile index out of range");
  const size_t row = (static_cast<size_t>(b % batch) * heads + h % heads) * num_q_blocks + qb;
  const int32_t* full = full_kv_indices.data() + row * num_kv_blocks;
  if (std::find(full, full + full_kv_num_blocks[row], kvb) != full + full_kv_num_blocks[row]) {
    return TileKind::Full;
  }
  const int32_t* part = kv_indices.data() + row * num_kv_blocks;
  if (std::find(part, part + kv_num_blocks[row], kvb) != part + kv_num_blocks[row]) {
    return TileKind::Partial;
  }
  return TileKind::Empty;
}

double BlockMask::density() const {
  const double tiles = static_cast<double>(batch) * heads * num_q_blocks * num_kv_blocks;
  if (tiles == 0) return 0.0;
  int64_t computed = 0;
  for (int32_t n : kv_num_blocks)
    computed += n;
  for (int32_t n : full_kv_num_blocks)
    computed += n;
  return static_cast<double>(computed) / tiles;
}

void BlockMask::build_transposed() {
  // Counts or indices out of range would send the transposition past the arrays: checked first.
  validate_arrays(*this, kv_num_blocks, kv_indices, num_q_blocks, num_kv_blocks, "kv_num_blocks",
                  "kv_indices");
  validate_arrays(*this, full_kv_num_blocks, full_kv_indices, num_q_blocks, num_kv_blocks,
                  "full_kv_num_blocks", "full_kv_indices");
  transpose(*this, kv_num_blocks, kv_indices, q_num_blocks, q_indices);
  transpose(*this, full_kv_num_blocks, full_kv_indices, full_q_num_blocks, full_q_indices);
}

void BlockMask::validate() const {
  runtime::check_block_mask_geometry(batch, heads, seqlen_q, seqlen_kv, q_block_size,
                                     kv_block_size);
  if (num_q_blocks != ceil_div(seqlen_q, q_block_size) ||
      num_kv_blocks != ceil_div(seqlen_kv, kv_block_size)) {
    throw RuntimeError(
        fmt::format("block counts {}x{} do not match sequence lengths {}x{} in {}x{} tiles",
                    num_q_blocks, num_kv_blocks, seqlen_q, seqlen_kv, q_block_size, kv_block_size));
  }
  const int nq = num_q_blocks, nkv = num_kv_blocks;
  validate_arrays(*this, kv_num_blocks, kv_indices, nq, nkv, "kv_num_blocks", "kv_indices");
  validate_arrays(*this, full_kv_num_blocks, full_kv_indices, nq, nkv, "full_kv_num_blocks",
                  "full_kv_indices");
  validate_arrays(*this, q_num_blocks, q_indices, nkv, nq, "q_num_blocks", "q_indices");
  validate_arrays(*this, full_q_num_blocks, full_q_indices, nkv, nq, "full_q_num_blocks",
                  "full_q_indices");
  for (size_t row = 0; row < kv_num_blocks.size(); ++row) {
    const int32_t* part = kv_indices.data() + row * nkv;
    const int32_t* full = full_kv_indices.data() + row * nkv;
    for (int i = 0; i < kv_num_blocks[row]; ++i) {
      if (std::find(full, full + full_kv_num_blocks[row], part[i]) !=
          full + full_kv_num_blocks[row]) {
        throw RuntimeError(fmt::format("KV tile {} of Q tile {} (row {}) is both partial and full",
                                       part[i], row % nq, row));
      }
    }
  }
  BlockMask t = *this;
  t.build_transposed();
  if (t.q_num_blocks != q_num_blocks || t.full_q_num_blocks != full_q_num_blocks) {
    throw RuntimeError("q_num_blocks / full_q_num_blocks are not the transpose of kv_*");
  }
  for (size_t row = 0; row < q_num_blocks.size(); ++row) {
    for (int kind = 0; kind < 2; ++kind) {
      const auto& mine = kind == 0 ? q_indices : full_q_indices;
      const auto& want = kind == 0 ? t.q_indices : t.full_q_indices;
      const int count = kind == 0 ? q_num_blocks[row] : full_q_num_blocks[row];
      if (!std::equal(mine.begin() + row * nq, mine.begin() + row * nq + count,
                      want.begin() + row * nq)) {
        throw RuntimeError(fmt::format("{} row {} is not the transpose of kv_*",
                                       kind == 0 ? "q_indices" : "full_q_indices", row));
      }
    }
  }
}

std::string BlockMask::str() const {
  return fmt::format("BlockMask(shape=[{}, {}, {}, {}], sparsity block {}x{}, density {:.2f}%)",
                     batch, heads, seqlen_q, seqlen_kv, q_block_size, kv_block_size,
                     100.0 * density());
}

BlockMask block_mask_from_tiles(int batch, int heads, int seqlen_q, int seqlen_kv,
                                const std::function<TileKind(int, int, int, int)>& fn,
                                int q_block_size, int kv_block_size) {
  BlockMask m = empty_geometry(batch, heads, seqlen_q, seqlen_kv, q_block_size, kv_block_size);
  const int nq = m.num_q_blocks, nkv = m.num_kv_blocks;
  const size_t rows = static_cast<size_t>(batch) * heads * nq;
  m.kv_num_blocks.assign(rows, 0);
  m.full_kv_num_blocks.assign(rows, 0);
  m.kv_indices.assign(rows * nkv, 0);
  m.full_kv_indices.assign(rows * nkv, 0);
  std::vector<bool> partial(nkv), full(nkv);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      for (int qb = 0; qb < nq; ++qb) {
        for (int kvb = 0; kvb < nkv; ++kvb) {
          const TileKind k = fn(b, h, qb, kvb);
          partial[kvb] = k == TileKind::Partial;
          full[kvb] = k == TileKind::Full;
        }
        const size_t row = (static_cast<size_t>(b) * heads + h) * nq + qb;
        write_row(partial, &m.kv_num_blocks[row], &m.kv_indices[row * nkv]);
        write_row(full, &m.full_kv_num_blocks[row], &m.full_kv_indices[row * nkv]);
      }
    }
  }
  m.build_transposed();
  return m;
}

BlockMask block_mask_from_dense(const std::vector<uint8_t>& mask, int batch, int heads,
                                int seqlen_q, int seqlen_kv, int q_block_size, int kv_block_size) {
  runtime::check_block_mask_geometry(batch, heads, seqlen_q, seqlen_kv, q_block_size,
                                     kv_block_size);
  const size_t want = static_cast<size_t>(batch) * heads * seqlen_q * seqlen_kv;
  if (mask.size() != want) {
    throw RuntimeError(fmt::format("dense mask has {} elements; expected {} ([{}, {}, {}, {}])",
                                   mask.size(), want, batch, heads, seqlen_q, seqlen_kv));
  }
  return block_mask_from_predicate(
      [&](int b, int h, int q, int kv) {
        return mask[((static_cast<size_t>(b) * heads + h) * seqlen_q + q) * seqlen_kv + kv] != 0;
      },
      batch, heads, seqlen_q, seqlen_kv, q_block_size, kv_block_size);
}

BlockMask block_mask_from_predicate(const std::function<bool(int, int, int, int)>& pred, int batch,
                                    int heads, int seqlen_q, int seqlen_kv, int q_block_size,
                                    int kv_block_size) {
  runtime::check_block_mask_geometry(batch, heads, seqlen_q, seqlen_kv, q_block_size,
                                     kv_block_size);
  return block_mask_from_tiles(
      batch, heads, seqlen_q, seqlen_kv,
      [&](int b, int h, int qb, int kvb) {
        const int q0 = qb * q_block_size, kv0 = kvb * kv_block_size;
        const int q1 = std::min(q0 + q_block_size, seqlen_q);
        const int kv1 = std::min(kv0 + kv_block_size, seqlen_kv);
        // Padding past the sequence end counts as masked, so a cut tile is never full.
        const bool whole = q1 - q0 == q_block_size && kv1 - kv0 == kv_block_size;
        bool any = false, all = whole;
        for (int q = q0; q < q1 && (all || !any); ++q) {
          for (int kv = kv0; kv < kv1; ++kv) {
            const bool v = pred(b, h, q, kv);
            any = any || v;
            all = all && v;
            if (any && !all) break;
          }
        }
        if (!any) return TileKind::Empty;
        return all ? TileKind::Full : TileKind::Partial;
      },
      q_block_size, kv_block_size);
}

BlockMask block_mask_from_document_ids(const std::vector<int32_t>& doc_ids, bool causal,
                                       int q_block_size, int kv_block_size) {
  const int s = static_cast<int>(doc_ids.size());
  BlockMask m = block_mask_from_predicate(
      [&](int, int, int q, int kv) { return doc_ids[q] == doc_ids[kv] && (!causal || q >= kv); }, 1,
      1, s, s, q_block_size, kv_block_size);
  Buffer ids("doc_ids", DType::I32, {"S"});
  m.mods = Mods::from_mask([&](Expr, Expr, Expr q, Expr kv) {
    Expr same = ids[q] == ids[kv];
    return causal ? (same && q >= kv) : same;
  });
  m.mods.name = causal ? "causal_document" : "document";
  return m;
}

BlockMask and_masks(const BlockMask& a, const BlockMask& b) {
  BlockMask m = combine_tiles(a, b, "and_masks", [](TileKind x, TileKind y) {
    if (x == TileKind::Empty || y == TileKind::Empty) return TileKind::Empty;
    if (x == TileKind::Full && y == TileKind::Full) return TileKind::Full;
    return TileKind::Partial;
  });
  m.mods = combine_mods(a, b, ir::Op::And);
  return m;
}

BlockMask or_masks(const BlockMask& a, const BlockMask& b) {
  BlockMask m = combine_tiles(a, b, "or_masks", [](TileKind x, TileKind y) {
    if (x == TileKind::Full || y == TileKind::Full) return TileKind::Full;
    if (x == TileKind::Empty && y == TileKind::Empty) return TileKind::Empty;
    return TileKind::Partial;
  });
  m.mods = combine_mods(a, b, ir::Op::Or);
  return m;
}

void runtime::check_block_mask_lengths(int seqlen_q, int seqlen_kv, int q_block_size,
                                       int kv_block_size) {
  if (seqlen_q < 0 || seqlen_kv < 0) {
    throw RuntimeError(fmt::format("block mask sequence lengths must be >= 0 (got {} and {})",
                                   seqlen_q, seqlen_kv));
  }
  if (q_block_size < 1 || kv_block_size < 1) {
    throw RuntimeError(fmt::format("block mask block sizes must be >= 1 (got {} and {})",
                                   q_block_size, kv_block_size));
  }
}

void runtime::check_block_mask_tiles(int64_t batch, int64_t heads, int64_t num_q_blocks,
                                     int64_t num_kv_blocks) {
  const std::optional<int64_t> tiles = checked_product({batch, heads, num_q_blocks, num_kv_blocks});
  if (!tiles || *tiles > kMaxBlockMaskTiles) {
    throw RuntimeError(
        fmt::format("a block mask of batch {} x heads {} x {} x {} tiles has more than 2^31 tiles",
                    batch, heads, num_q_blocks, num_kv_blocks));
  }
}

void runtime::check_block_mask_geometry(int batch, int heads, int seqlen_q, int seqlen_kv,
                                        int q_block_size, int kv_block_size) {
  if (batch < 1 || heads < 1) {
    throw RuntimeError(
        fmt::format("block mask batch and heads must be >= 1 (got {} and {})", batch, heads));
  }
  check_block_mask_lengths(seqlen_q, seqlen_kv, q_block_size, kv_block_size);
  check_block_mask_tiles(batch, heads, block_count(seqlen_q, q_block_size),
                         block_count(seqlen_kv, kv_block_size));
}

}  // namespace flexjit
