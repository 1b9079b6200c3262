// Random evaluation environments for the pass property tests: every buffer of RandomExprGen's
// pool bound to random host data (symbolic dims B=4, H=8, S=16), every param given a random
// value, and leaves drawn mostly inside those extents (so that loads are usually in bounds) with
// occasional extreme values.
#pragma once

#include "ir/Evaluate.h"
#include "ir/IR.h"
#include "support/RandomExpr.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace flexjit::test {

class PassesEnv {
 public:
  explicit PassesEnv(const RandomExprGen& gen, uint64_t seed) : rng_(seed) {
    for (const Buffer& b : gen.buffer_pool()) {
      std::vector<int64_t> shape;
      int64_t n = 1;
      for (const auto& d : b.decl()->dims) {
        int64_t extent = d == "B" ? 4 : d == "H" ? 8 : d == "S" ? 16 : std::stoll(d);
        shape.push_back(extent);
        n *= extent;
      }
      storage_.emplace_back(static_cast<size_t>(n) * 4);
      std::vector<uint8_t>& bytes = storage_.back();
      for (int64_t i = 0; i < n; ++i)
        fill(b.dtype(), bytes.data(), i);
      env_.buffers[b.name()] = ir::BufferView{bytes.data(), b.dtype(), shape, {}};
    }
    for (const Param& p : gen.param_pool())
      params_.push_back(p);
  }

  // A fresh random environment (buffers stay bound).
  const ir::EvalEnv& next() {
    env_.score = random_float();
    env_.b = random_index(4);
    env_.h = random_index(8);
    env_.q_idx = random_index(16);
    env_.kv_idx = random_index(16);
    for (const Param& p : params_) {
      switch (p.type()) {
        case ScalarType::F32:
          env_.params[p.name()] = random_float();
          break;
        case ScalarType::I32:
          env_.params[p.name()] = random_index(16);
          break;
        case ScalarType::Bool:
          env_.params[p.name()] = static_cast<double>(rng_() % 2);
          break;
      }
    }
    return env_;
  }

  float random_float() {
    static constexpr float kSpecial[] = {0.0f,
                                         -0.0f,
                                         1.0f,
                                         -1.0f,
                                         0.5f,
                                         3.0f,
                                         1e30f,
                                         -1e-30f,
                                         std::numeric_limits<float>::infinity(),
                                         -std::numeric_limits<float>::infinity(),
                                         std::numeric_limits<float>::quiet_NaN(),
                                         std::numeric_limits<float>::denorm_min()};
    if (rng_() % 4 == 0) return kSpecial[rng_() % std::size(kSpecial)];
    double mant = static_cast<double>(rng_() >> 11) / static_cast<double>(1ull << 53);
    return static_cast<float>((mant * 2.0 - 1.0) * std::ldexp(1.0, static_cast<int>(rng_() % 20)));
  }

  int32_t random_index(int32_t extent) {
    static constexpr int32_t kExtreme[] = {-1, std::numeric_limits<int32_t>::min(),
                                           std::numeric_limits<int32_t>::max(), 1 << 20};
    if (rng_() % 16 == 0) return kExtreme[rng_() % std::size(kExtreme)];
    return static_cast<int32_t>(rng_() % static_cast<uint64_t>(extent));
  }

 private:
  void fill(DType t, uint8_t* base, int64_t i) {
    switch (t) {
      case DType::F32: {
        float f = random_float();
        std::memcpy(base + i * 4, &f, 4);
        break;
      }
      case DType::F16:
      case DType::BF16: {
        uint16_t bits = static_cast<uint16_t>(rng_());
        std::memcpy(base + i * 2, &bits, 2);
        break;
      }
      case DType::I32: {
        int32_t v = random_index(16);
        std::memcpy(base + i * 4, &v, 4);
        break;
      }
      case DType::Bool:
      case DType::E4M3:  // (captured buffers take no e4m3)
        base[i] = static_cast<uint8_t>(rng_() % 2);
        break;
    }
  }

  std::mt19937_64 rng_;
  ir::EvalEnv env_;
  std::vector<Param> params_;
  std::vector<std::vector<uint8_t>> storage_;
};

}  // namespace flexjit::test
