// Pictures of a block mask, in the style of attention-gym's visualizations: text for terminals
// (`flexjit mask show`) and PPM images.
#include <flexjit/block_mask.h>
#include <flexjit/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace flexjit {

namespace {

constexpr const char* kFullGlyph = "█";
constexpr const char* kPartialGlyph = "░";
constexpr const char* kEmptyGlyph = "·";

void check_head(const BlockMask& m, int b, int h) {
  if (b < 0 || h < 0 || (m.batch > 1 && b >= m.batch) || (m.heads > 1 && h >= m.heads)) {
    throw RuntimeError(
        fmt::format("tile ({}, {}) requested from a block mask of batch {} and "
                    "heads {}",
                    b, h, m.batch, m.heads));
  }
}

// The class of a cell covering tiles [q0, q1) x [kv0, kv1): full or empty when all are.
TileKind cell(const BlockMask& m, int b, int h, int q0, int q1, int kv0, int kv1) {
  bool all_full = true, all_empty = true;
  for (int qb = q0; qb < q1; ++qb) {
    for (int kvb = kv0; kvb < kv1; ++kvb) {
      const TileKind k = m.tile(b, h, qb, kvb);
      all_full = all_full && k == TileKind::Full;
      all_empty = all_empty && k == TileKind::Empty;
    }
  }
  if (all_full) return TileKind::Full;
  return all_empty ? TileKind::Empty : TileKind::Partial;
}

}  // namespace

std::string to_picture(const BlockMask& m, int b, int h, int max_width) {
  check_head(m, b, h);
  if (max_width < 1) throw RuntimeError(fmt::format("picture width {} is below 1", max_width));
  // One factor for both axes keeps the picture's aspect ratio.
  const int step =
      std::max(1, (std::max(m.num_q_blocks, m.num_kv_blocks) + max_width - 1) / max_width);
  std::string out = fmt::format("block mask b={} h={}: {} x {} tiles of {}x{} (Sq={}, Skv={})", b,
                                h, m.num_q_blocks, m.num_kv_blocks, m.q_block_size, m.kv_block_size,
                                m.seqlen_q, m.seqlen_kv);
  if (step > 1) out += fmt::format(", one cell per {}x{} tiles", step, step);
  out += "\n";
  for (int q0 = 0; q0 < m.num_q_blocks; q0 += step) {
    for (int kv0 = 0; kv0 < m.num_kv_blocks; kv0 += step) {
      const TileKind k = cell(m, b, h, q0, std::min(q0 + step, m.num_q_blocks), kv0,
                              std::min(kv0 + step, m.num_kv_blocks));
      out += k == TileKind::Full      ? kFullGlyph
             : k == TileKind::Partial ? kPartialGlyph
                                      : kEmptyGlyph;
    }
    out += "\n";
  }
  out += fmt::format("{} full  {} partial  {} empty  density {:.2f}%\n", kFullGlyph, kPartialGlyph,
                     kEmptyGlyph, 100.0 * m.density());
  return out;
}

void write_ppm(const BlockMask& m, const std::string& path, int b, int h, int scale) {
  check_head(m, b, h);
  if (scale < 1) throw RuntimeError(fmt::format("PPM scale {} is below 1", scale));
  const int width = m.num_kv_blocks * scale, height = m.num_q_blocks * scale;
  std::string pixels;
  pixels.reserve(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const TileKind k = m.tile(b, h, y / scale, x / scale);
      const char v = static_cast<char>(k == TileKind::Full      ? 0
                                       : k == TileKind::Partial ? 160
                                                                : 255);
      pixels.append(3, v);
    }
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(fmt::format("{}: cannot open for writing: {}", path, std::strerror(errno)));
  out << fmt::format("P6\n{} {}\n255\n", width, height);
  out.write(pixels.data(), static_cast<std::streamsize>(pixels.size()));
  if (!out) throw Error(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
}

}  // namespace flexjit
