// The reference interpreter: the definition of what a mod expression means.
//
// Every backend (CUDA codegen, the LLVM CPU backend) and every pass (constant folding in
// passes/Simplify, interval reasoning in passes/Interval) follows the semantics implemented
// here; tests compare against it. The rules, for reference (docs/passes.md has the table):
//   i32 + - * and unary -  wrap mod 2^32 (computed in uint32, never UB)
//   i32 /                  floor division; x / 0 == 0; INT_MIN / -1 == INT_MIN (wraps)
//   i32 %                  floor modulo (result has the divisor's sign); x % 0 == 0
//   abs(i32)               abs(INT_MIN) == INT_MIN (wraps)
//   f32 arithmetic         in float precision; `/` is IEEE division;
//                          `%` is a - b * floor(a / b) (evaluated in float)
//   min/max on f32         fminf / fmaxf (a NaN operand yields the other operand)
//   math functions         expf, exp2f, logf, log2f, tanhf, sqrtf, floorf, ceilf, powf;
//                          sigmoid(x) = 1 / (1 + expf(-x)); rsqrt(x) = 1 / sqrtf(x)
//   int(x)                 truncates toward zero, saturates at the i32 range, NaN -> 0
//   float(bool), int(bool) 0 or 1
//   where(c, a, b), &&, || evaluate only what they select (short-circuit, as C does): an
//                          out-of-bounds load in an unselected branch is not an error
//   buffer[i]...           out of bounds is a RuntimeError naming the buffer and the index;
//                          f16 / bf16 buffers are widened exactly to f32
#pragma once

#include <flexjit/mods.h>

#include "ir/IR.h"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace flexjit::ir {

// A value of the language: one of bool, i32, f32.
struct Value {
  ScalarType type = ScalarType::I32;
  int32_t i = 0;   // I32 value; Bool as 0 / 1
  float f = 0.0f;  // F32 value

  static Value of_i32(int32_t v) { return Value{ScalarType::I32, v, 0.0f}; }
  static Value of_f32(float v) { return Value{ScalarType::F32, 0, v}; }
  static Value of_bool(bool v) { return Value{ScalarType::Bool, v ? 1 : 0, 0.0f}; }
  bool as_bool() const { return i != 0; }
  // "3", "true", "1.5" (floats in shortest round-trip form, as the printer writes them).
  std::string str() const;
};

// Same type and the same bits, except that any NaN equals any NaN (NaN payloads are not part of
// the language's semantics). +0.0 and -0.0 differ.
bool identical(const Value& a, const Value& b);

// The constant node holding `v` (IntImm / FloatImm / BoolImm).
Expr make_const(const Value& v);
// True for IntImm / FloatImm / BoolImm, whose value is then written to *out (if not null).
bool const_value(const Expr& e, Value* out = nullptr);

// The language's operations on values. Argument types must match the node rules of IR.h
// (FJ_ASSERT otherwise); these never fail on any input.
Value apply_unary(Op op, const Value& a);
Value apply_binary(Op op, const Value& a, const Value& b);
Value apply_cast(ScalarType to, const Value& a);

// IEEE binary16 and bfloat16 conversions. To-half conversions round to nearest even and keep
// NaN a NaN; from-half conversions are exact.
float f16_bits_to_float(uint16_t bits);
uint16_t float_to_f16_bits(float v);
float bf16_bits_to_float(uint16_t bits);
uint16_t float_to_bf16_bits(float v);
// OCP float8 e4m3fn (bias 7, 3 mantissa bits, max 448, no infinities, NaN 0x7f / 0xff).
// float_to_e4m3_bits rounds to nearest even and saturates finite values and infinities to
// +-448 (what torch's .to(float8_e4m3fn) does for in-range values; quantizers scale first);
// NaN stays NaN. e4m3_bits_to_float is exact.
float e4m3_bits_to_float(uint8_t bits);
uint8_t float_to_e4m3_bits(float v);

// A host buffer bound to a captured buffer name. Strides and shape are in elements; f16 / bf16
// elements are uint16 bit patterns, bool elements are bytes (non-zero is true).
struct BufferView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // empty means contiguous row-major
};

// Where a mod is evaluated: the leaves, parameter values and buffers, by name.
struct EvalEnv {
  float score = 0.0f;
  int32_t b = 0, h = 0, q_idx = 0, kv_idx = 0;
  // Parameter values by name; a parameter missing here uses its declared default value, and
  // is a RuntimeError if it has none. i32 values must be integral, bool values 0 or 1.
  std::unordered_map<std::string, double> params;
  std::unordered_map<std::string, BufferView> buffers;
};

// Evaluates one expression many times (the CPU block-mask path evaluates a mask_mod at every
// point): the DAG is flattened once, then run() evaluates iteratively, each shared node once.
// Throws RuntimeError for an unbound parameter or buffer, a buffer whose dtype / rank / numeric
// dims disagree with its declaration, and out-of-bounds loads.
class Evaluator {
 public:
  explicit Evaluator(const Expr& e);
  Value run(const EvalEnv& env);

 private:
  struct Instr {
    const Node* node;
    std::vector<int> args;  // indices into code_
  };
  void check_buffer(const BufferDecl& decl, const BufferView& view) const;
  Value load(const Node& n, const std::vector<Value>& idx, const EvalEnv& env) const;
  Value param(const ParamDecl& p, const EvalEnv& env) const;

  Expr expr_;                // keeps the nodes alive
  std::vector<Instr> code_;  // children before parents; the root last
  std::vector<Value> values_;
  std::vector<uint32_t> stamp_;  // values_[i] is valid when stamp_[i] == generation_
  uint32_t generation_ = 0;
};

// Evaluate once.
Value evaluate(const Expr& e, const EvalEnv& env);

// score_mod(env.score, ...) (identity when undefined) and mask_mod(...) (true when undefined).
struct ModsValue {
  float score;
  bool keep;
};
ModsValue evaluate_mods(const Mods& mods, const EvalEnv& env);

}  // namespace flexjit::ir
