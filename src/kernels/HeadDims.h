// Head dims and the tile dims a kernel computes them in.
//
// A problem's head dims (KernelDesc::head_dim_qk / head_dim_v) are the tensors' own: any
// multiple of 8 up to kMaxHeadDim. A kernel variant compiles a few tile dims (the shared-memory
// and register layouts it was written for, e.g. 64 / 128 / 256) and computes a problem's head
// dim in the smallest tile dim at least as large: loads zero-fill the columns past the head dim
// (a TMA tensor map whose extent is the head dim; cp.async with no source bytes), the padded
// columns add nothing to q.k and carry no value, and stores write only the head dim's columns
// (docs/kernels/README.md "Head dims"). The scale's default is 1/sqrt(head_dim_qk), the real one.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>

namespace flexjit::kernels {

constexpr int kHeadDimQuantum = 8;  // 16 bytes of bf16: one cp.async / TMA row granule
constexpr int kMaxHeadDim = 256;

// The smallest of `tiles` (ascending) at least `head_dim`; nullopt when `head_dim` is not a
// positive multiple of kHeadDimQuantum, or exceeds every tile.
std::optional<int> tile_head_dim(int head_dim, std::initializer_list<int> tiles);

// The line of a generated FjConfig that carries the problem's own head dims beside the tile dims
// (kHeadDimQK / kHeadDimV): "static constexpr int kRealDimQK = 96, kRealDimV = 96;".
std::string real_head_dims_line(int head_dim_qk, int head_dim_v);

// Why a variant (`who`, e.g. "forward/sm80_mma") cannot take `head_dim` for `what`
// ("head_dim_qk"): names the rule and the tile dims it pads to; nullopt when it can.
std::optional<std::string> head_dim_reason(const std::string& who, const char* what, int head_dim,
                                           std::initializer_list<int> tiles);

}  // namespace flexjit::kernels
