// flexjit._flexjit: the nanobind module under the Python package (python/flexjit/*.py).
//
// Tensors arrive as nb::ndarray (any DLPack producer: NumPy, PyTorch, CuPy, JAX) and are viewed
// as TensorRefs without a copy; the Python layer allocates outputs in the caller's framework and
// passes them in. flexjit::Error subclasses become Python exceptions of the same names, and the
// GIL is released while flexjit compiles and runs.
#include <flexjit/flexjit.h>
#include <flexjit/kernel.h>

#include "Pipeline.h"                  // KernelBuilder::stop_all_background at exit
#include "cpu/BackwardKernel.h"        // the CPU backward (no public header yet)
#include "cpu/BufferIndexCheck.h"      // check_buffers before the CPU backward
#include "cpu/InterpretedBlockMask.h"  // no public host builder from a mask_mod yet
#include "ir/Evaluate.h"
#include "util/Suggest.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <dlpack/dlpack.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace flexjit {
namespace {

using Array = nb::ndarray<nb::ro>;

// --- tensors ---------------------------------------------------------------------------------

// The framework's word for a DLPack dtype: float64, int64, uint8, bfloat16, complex64, bool;
// "float32x4" for several lanes.
std::string dtype_word(const nb::dlpack::dtype& d) {
  std::string kind;
  switch (d.code) {
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Int):
      kind = "int";
      break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::UInt):
      kind = "uint";
      break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Float):
      kind = "float";
      break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat):
      kind = "bfloat";
      break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Complex):
      kind = "complex";
      break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Bool):
      kind = "bool";
      break;
    default:
      kind = "<DLPack type code " + std::to_string(d.code) + ">";
  }
  std::string w = kind == "bool" && d.bits == 8 ? kind : kind + std::to_string(d.bits);
  if (d.lanes != 1) w += "x" + std::to_string(d.lanes);
  return w;
}

// What each argument takes, in the frameworks' words, for the dtype errors below.
constexpr const char* kTakesFloat = "float32, float16, bfloat16";
constexpr const char* kTakesF32 = "float32";
// q, k, v of the forward: also float8_e4m3fn (sm_90a and the CPU backend, with descales).
constexpr const char* kTakesQkv = "float32, float16, bfloat16, float8_e4m3fn";
constexpr const char* kTakesInt32 = "int32";
constexpr const char* kTakesAny = "float32, float16, bfloat16, int32, bool (or uint8)";

// Views an nb::ndarray through flexjit's own DLPack rules. `what` names the argument in every
// error ("q", "buffer 'doc_ids'"); a dtype flexjit has no type for says what the argument takes
// (`takes`): "q has dtype float64; flexjit takes float32, float16, bfloat16 for q".
TensorRef to_tensor(const Array& a, std::string_view what, std::string_view takes) {
  const nb::dlpack::dtype d = a.dtype();
  using Code = nb::dlpack::dtype_code;
  const bool representable =
      d.lanes == 1 &&
      ((d.code == static_cast<uint8_t>(Code::Float) && (d.bits == 32 || d.bits == 16)) ||
       (d.code == static_cast<uint8_t>(Code::Bfloat) && d.bits == 16) ||
       (d.code == static_cast<uint8_t>(Code::Float8_E4M3FN) && d.bits == 8) ||
       (d.code == static_cast<uint8_t>(Code::Int) && d.bits == 32) ||
       ((d.code == static_cast<uint8_t>(Code::Bool) ||
         d.code == static_cast<uint8_t>(Code::UInt)) &&
        d.bits == 8));
  if (!representable) {
    throw RuntimeError(std::string(what) + " has dtype " + dtype_word(d) + "; flexjit takes " +
                       std::string(takes) + " for " + std::string(what));
  }
  DLTensor t{};
  t.data = const_cast<void*>(a.data());
  t.device = {static_cast<DLDeviceType>(a.device_type()), a.device_id()};
  t.ndim = static_cast<int32_t>(a.ndim());
  t.dtype = {a.dtype().code, a.dtype().bits, a.dtype().lanes};
  t.shape = const_cast<int64_t*>(a.shape_ptr());
  t.strides = const_cast<int64_t*>(a.stride_ptr());
  t.byte_offset = 0;
  try {
    return from_dlpack(t);
  } catch (const RuntimeError& e) {  // a device type or shape DLPack allows and flexjit not
    throw RuntimeError(std::string(what) + ": " + e.what());
  }
}

// The dtype a buffer's declaration takes, in the frameworks' words (bindings must match it).
std::string_view takes_for(DType d) {
  return d == DType::Bool ? std::string_view("bool (or uint8)") : framework_name(d);
}

// A Python expression operand: Expr, Param, a complete buffer index, bool, int or float.
struct BufferIndex {
  Buffer buffer;
  std::vector<Expr> indices;
};

Expr to_expr(nb::handle h) {
  if (nb::isinstance<Expr>(h)) return nb::cast<Expr>(h);
  if (nb::isinstance<Param>(h)) return nb::cast<Param>(h).expr();
  if (nb::isinstance<BufferIndex>(h)) {
    const auto& bi = nb::cast<const BufferIndex&>(h);
    return bi.buffer(bi.indices);  // CompileError: too few indices
  }
  if (PyBool_Check(h.ptr())) return Expr(h.ptr() == Py_True);
  if (PyLong_Check(h.ptr())) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
    if (overflow != 0) throw CompileError("integer constant does not fit in i32");
    return Expr(static_cast<int64_t>(v));
  }
  if (PyFloat_Check(h.ptr())) return Expr(PyFloat_AsDouble(h.ptr()));
  // NumPy scalars and the like.
  if (nb::hasattr(h, "__index__")) return to_expr(h.attr("__index__")());
  if (nb::hasattr(h, "__float__")) return Expr(nb::cast<double>(h.attr("__float__")()));
  throw nb::type_error(("a mod expression cannot use a value of type " +
                        nb::cast<std::string>(nb::str(h.type().attr("__name__"))))
                           .c_str());
}

Expr true_div(const Expr& a, const Expr& b) {
  // Between two i32 values `/` means different things in the two front ends (Python divides
  // exactly, as PyTorch does; .fx text floors), so the same-looking mask would differ: it is an
  // error that names the operator to use (docs/dsl.md, "Division").
  if (a.type() == ScalarType::I32 && b.type() == ScalarType::I32) {
    throw nb::type_error(
        "`/` between two i32 values: in .fx text it floors, in Python it would divide exactly, "
        "so flexjit takes neither; write `a // b` for floor division (.fx's `/`) or "
        "`dsl.to_float(a) / b` for true division");
  }
  return a / b;
}

Expr floor_div(const Expr& a, const Expr& b) {
  if (a.type() == ScalarType::I32 && b.type() == ScalarType::I32) return a / b;
  return floor(a / b);
}

// The operators of Expr, Param and BufferIndex: each converts `self` and the operand to Expr.
template <typename T>
void def_operators(nb::class_<T>& c) {
  using Binary = Expr (*)(const Expr&, const Expr&);
  struct Op {
    const char* name;
    const char* reflected;  // null for comparisons
    Binary f;
  };
  const Op ops[] = {
      {"__add__", "__radd__", [](const Expr& a, const Expr& b) { return a + b; }},
      {"__sub__", "__rsub__", [](const Expr& a, const Expr& b) { return a - b; }},
      {"__mul__", "__rmul__", [](const Expr& a, const Expr& b) { return a * b; }},
      {"__truediv__", "__rtruediv__", &true_div},
      {"__floordiv__", "__rfloordiv__", &floor_div},
      {"__mod__", "__rmod__", [](const Expr& a, const Expr& b) { return a % b; }},
      {"__pow__", "__rpow__", [](const Expr& a, const Expr& b) { return pow(a, b); }},
      {"__and__", "__rand__", [](const Expr& a, const Expr& b) { return a && b; }},
      {"__or__", "__ror__", [](const Expr& a, const Expr& b) { return a || b; }},
      {"__eq__", nullptr, [](const Expr& a, const Expr& b) { return a == b; }},
      {"__ne__", nullptr, [](const Expr& a, const Expr& b) { return a != b; }},
      {"__lt__", nullptr, [](const Expr& a, const Expr& b) { return a < b; }},
      {"__le__", nullptr, [](const Expr& a, const Expr& b) { return a <= b; }},
      {"__gt__", nullptr, [](const Expr& a, const Expr& b) { return a > b; }},
      {"__ge__", nullptr, [](const Expr& a, const Expr& b) { return a >= b; }},
  };
  for (const Op& op : ops) {
    Binary f = op.f;
    c.def(op.name, [f](nb::handle self, nb::handle o) { return f(to_expr(self), to_expr(o)); });
    if (op.reflected != nullptr) {
      c.def(op.reflected,
            [f](nb::handle self, nb::handle o) { return f(to_expr(o), to_expr(self)); });
    }
  }
  c.def("__neg__", [](nb::handle self) { return -to_expr(self); });
  c.def("__pos__", [](nb::handle self) { return to_expr(self); });
  c.def("__abs__", [](nb::handle self) { return abs(to_expr(self)); });
  c.def("__invert__", [](nb::handle self) { return !to_expr(self); });
  c.def("__bool__", [](nb::handle) -> bool {
    throw nb::type_error(
        "a mod expression has no truth value in Python: use & | ~ for and / or / not, "
        "dsl.where(cond, a, b) for a conditional, and parenthesise comparisons: (q >= kv) & m");
  });
  c.attr("__hash__") = nb::none();
}

// --- the GPU ---------------------------------------------------------------------------------

// One Context per device for the life of the process (deliberately never destroyed: the
// driver may be unloaded before static destructors run).
Context& context_for(int device) {
  static std::mutex mu;
  static std::map<int, Context*> contexts;
  std::lock_guard<std::mutex> lock(mu);
  auto it = contexts.find(device);
  if (it != contexts.end()) return *it->second;
  ContextOptions o;
  o.device = device;
  Context* ctx = new Context(o);
  contexts.emplace(device, ctx);
  return *ctx;
}

// The bindings of a call of `needed`: every buffer it reads must be in `buffers`, said in
// Python's terms (the library's own message names C++'s bindings.buffers).
ModBindings to_bindings(const Mods& needed,
                        const std::vector<std::pair<std::string, Array>>& buffers,
                        const std::vector<std::pair<std::string, double>>& params) {
  for (const Buffer& buf : needed.buffers) {
    bool bound = false;
    for (const auto& [name, a] : buffers)
      bound = bound || name == buf.name();
    if (bound) continue;
    std::string dims;
    for (const std::string& d : buf.decl()->dims)
      dims += (dims.empty() ? "" : ", ") + d;
    const std::string decl = std::string(to_string(buf.dtype())) + "[" + dims + "]";
    throw RuntimeError("the mods '" + needed.name + "' read buffer '" + buf.name() + "' (" + decl +
                       "); pass it as buffers={'" + buf.name() + "': <array of " + decl + ">}");
  }
  ModBindings b;
  for (const auto& [name, a] : buffers) {
    std::string_view takes = kTakesAny;  // a name the mods do not declare: any dtype flexjit has
    for (const Buffer& buf : needed.buffers) {
      if (buf.name() == name) takes = takes_for(buf.dtype());
    }
    b.buffers.emplace_back(name, to_tensor(a, "buffer '" + name + "'", takes));
  }
  b.params = params;
  return b;
}

// A block mask on the CPU (host arrays) or on a GPU.
struct PyBlockMask {
  BlockMask host;  // the CPU mask, or the GPU mask's meta (no arrays)
  std::shared_ptr<DeviceBlockMask> device;
  int device_index = -1;  // -1: CPU

  const BlockMask& meta() const { return device ? device->meta() : host; }
  BlockMask to_host() const { return device ? device->to_host() : host; }
};

// The CPU backend builds its block mask from the mask_mod: without one in `mods`, a block mask's
// mask_mod is taken (as flex_attention does on the GPU).
Mods cpu_mods(const Mods& mods, const PyBlockMask* block_mask) {
  if (block_mask == nullptr || mods.mask_mod.defined()) return mods;
  const Mods& bm = block_mask->meta().mods;
  if (!bm.mask_mod.defined()) {
    throw UnsupportedError(
        "the CPU backend needs the mask_mod a block mask was built from; this block mask has "
        "none (pass mask_mod=...)");
  }
  return combine(mods, Mods::from_mask([&](Expr, Expr, Expr, Expr) { return bm.mask_mod; }));
}

// The CPU backend builds its tiles from the mask_mod, so a block mask's sizes are checked here as
// flex_attention checks them on the GPU: one built for other sizes is an error, not ignored.
// (With a KV cache the keys' length is the cache's: only Sq, B and H are compared.)
void check_cpu_block_mask(const PyBlockMask* block_mask, const TensorRef& q, const TensorRef& k,
                          bool kv_cache) {
  if (block_mask == nullptr || q.ndim() != 4 || k.ndim() != 4) return;  // the call names bad ranks
  const BlockMask& m = block_mask->meta();
  if (m.seqlen_q != q.shape[2] || (!kv_cache && m.seqlen_kv != k.shape[2])) {
    throw RuntimeError("the block mask was built for Sq=" + std::to_string(m.seqlen_q) +
                       ", Skv=" + std::to_string(m.seqlen_kv) +
                       " but the inputs have Sq=" + std::to_string(q.shape[2]) +
                       ", Skv=" + std::to_string(k.shape[2]) + "; build it for these lengths");
  }
  if (m.batch != 1 && m.batch != q.shape[0]) {
    throw RuntimeError("the block mask has batch " + std::to_string(m.batch) +
                       "; expected 1 or B=" + std::to_string(q.shape[0]));
  }
  if (m.heads != 1 && m.heads != q.shape[1]) {
    throw RuntimeError("the block mask has " + std::to_string(m.heads) +
                       " heads; expected 1 or Hq=" + std::to_string(q.shape[1]));
  }
}

// The block mask of a GPU call on `device`: the mask's own device arrays (a mask on another
// device is an error), or the host mask uploaded into `uploaded` (which must outlive the call).
const DeviceBlockMask* device_block_mask(Context& ctx, int device, const PyBlockMask* block_mask,
                                         std::optional<DeviceBlockMask>& uploaded) {
  if (block_mask == nullptr) return nullptr;
  if (block_mask->device) {
    if (block_mask->device_index != device) {
      throw RuntimeError("the block mask is on cuda:" + std::to_string(block_mask->device_index) +
                         " but the inputs are on cuda:" + std::to_string(device) +
                         "; build it on the inputs' device");
    }
    return block_mask->device.get();
  }
  uploaded = DeviceBlockMask::upload(ctx, block_mask->host);
  return &*uploaded;
}

// --- the config of a call (the `config` dict of _flex_attention_into / _backward_into) ---------

// What a call's `config` dict sets: the BlockConfig fields and params, the variant, the autotune
// and math modes, check_buffers and, for the backward, the dQ mode. Keys left out (or None) keep
// the defaults.
struct CallConfig {
  BlockConfig block;
  std::string variant;
  AutotuneMode autotune = AutotuneMode::FromEnv;
  MathMode math = MathMode::Auto;
  BackwardOptions::DqMode dq_mode = BackwardOptions::DqMode::Auto;
  bool check_buffers = false;

  void apply(AttentionOptions& o) const {
    o.config = block;
    o.variant = variant;
    o.autotune = autotune;
    o.math = math;
    o.check_buffers = check_buffers;
  }
};

// The config keys of the families a call's plans run (kernel_families(): a forward call runs the
// forward or the decode plan, the backward its own), then the call's words. The kinds are named
// here, not read from a record: which plans a public call runs is the call's own (flex_attention
// picks the decode plan for a KV cache or short queries), so a new family of these kinds needs no
// edit and a new kind comes with its own call. flexjit.torch's kernel_options reads the result
// (_call_config_keys).
std::vector<std::string> call_config_keys(const std::vector<std::string>& kinds,
                                          const std::vector<std::string>& words) {
  std::vector<std::string> keys;
  for (const std::string& kind : kinds) {
    for (const KernelFamilyInfo& f : kernel_families()) {
      if (f.kind != kind) continue;
      for (const KernelConfigKey& k : f.config_keys) {
        if (std::find(keys.begin(), keys.end(), k.name) == keys.end()) keys.push_back(k.name);
      }
    }
  }
  keys.insert(keys.end(), words.begin(), words.end());
  return keys;
}

const std::vector<std::string>& forward_config_keys() {
  static const std::vector<std::string> keys =
      call_config_keys({"forward", "decode"}, {"variant", "autotune", "math", "check_buffers"});
  return keys;
}

const std::vector<std::string>& backward_config_keys() {
  static const std::vector<std::string> keys =
      call_config_keys({"backward"}, {"variant", "autotune", "math", "dq_mode", "check_buffers"});
  return keys;
}

std::string joined(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words)
    s += (s.empty() ? "" : ", ") + w;
  return s;
}

std::string py_repr(nb::handle h) {
  return nb::cast<std::string>(nb::repr(h));
}

std::string py_type_name(nb::handle h) {
  return nb::cast<std::string>(nb::str(h.type().attr("__name__")));
}

// One of `words` (a str); RuntimeError naming the key, the value and the words otherwise.
std::string config_word(const std::string& key, nb::handle value,
                        const std::vector<std::string>& words) {
  if (nb::isinstance<nb::str>(value)) {
    const std::string w = nb::cast<std::string>(value);
    for (const std::string& ok : words) {
      if (w == ok) return w;
    }
  }
  throw RuntimeError("config['" + key + "'] = " + py_repr(value) + " is not one of " +
                     joined(words));
}

// The `config` dict of a forward (backward = false) or backward call.
CallConfig parse_config(const std::optional<nb::dict>& config, bool backward) {
  CallConfig c;
  if (!config) return c;
  const std::vector<std::string>& keys = backward ? backward_config_keys() : forward_config_keys();
  const char* call = backward ? "the backward" : "the forward";
  for (auto [k, value] : *config) {
    if (!nb::isinstance<nb::str>(k)) {
      throw RuntimeError("config keys are strings; got " + py_repr(k) + " (" + call + " takes " +
                         joined(keys) + ")");
    }
    const std::string key = nb::cast<std::string>(k);
    bool known = false;
    for (const std::string& ok : keys)
      known = known || key == ok;
    if (!known) {
      const std::vector<std::string>& other =
          backward ? forward_config_keys() : backward_config_keys();
      const bool other_call = std::find(other.begin(), other.end(), key) != other.end();
      throw RuntimeError("config key '" + key + "' " +
                         (other_call ? std::string("applies to ") +
                                           (backward ? "the forward" : "the backward") + " only"
                                     : "is unknown" + did_you_mean(key, keys)) +
                         "; " + call + " takes " + joined(keys));
    }
    if (value.is_none()) continue;  // the default
    if (key == "variant") {
      if (!nb::isinstance<nb::str>(value)) {
        throw RuntimeError("config['variant'] must be a kernel variant's name (a str), not " +
                           py_repr(value) + "; flexjit.kernel_variants() lists them");
      }
      c.variant = nb::cast<std::string>(value);
    } else if (key == "autotune") {
      const std::string w = config_word(key, value, {"off", "cached", "search"});
      c.autotune = w == "off"      ? AutotuneMode::Off
                   : w == "cached" ? AutotuneMode::Cached
                                   : AutotuneMode::Search;
    } else if (key == "math") {
      c.math = *parse_math_mode(config_word(key, value, {"auto", "exact", "approx"}));
    } else if (key == "check_buffers") {  // a bool (or 0 / 1: flexjit.torch's kernel_options)
      int overflow = 0;
      const long long v =
          PyLong_Check(value.ptr()) ? PyLong_AsLongLongAndOverflow(value.ptr(), &overflow) : -1;
      if (overflow != 0 || (v != 0 && v != 1)) {
        throw RuntimeError("config['check_buffers'] must be True or False, not " + py_repr(value));
      }
      c.check_buffers = v == 1;
    } else if (key == "dq_mode") {
      const std::string w = config_word(key, value, {"auto", "second_pass", "atomic"});
      c.dq_mode = w == "auto"          ? BackwardOptions::DqMode::Auto
                  : w == "second_pass" ? BackwardOptions::DqMode::SecondPass
                                       : BackwardOptions::DqMode::Atomic;
    } else {  // a config key of the call's families: an int
      if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr())) {
        throw RuntimeError("config['" + key + "'] must be an int, not " + py_type_name(value) +
                           " (" + py_repr(value) + ")");
      }
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
      const bool persistent = key == "persistent";
      if (overflow != 0 || (persistent ? (v < -1 || v > 1) : (v < 0 || v > INT32_MAX))) {
        throw RuntimeError("config['" + key + "'] = " + py_repr(value) +
                           (persistent ? " is not 1 (persistent CTAs), -1 (one CTA per query "
                                         "tile) or 0 (the default)"
                                       : " is out of range: 0 (the default) or a positive int"));
      }
      const int i = static_cast<int>(v);
      if (key == "block_m") {
        c.block.block_m = i;
      } else if (key == "block_n") {
        c.block.block_n = i;
      } else if (key == "num_warps") {
        c.block.num_warps = i;
      } else if (key == "num_stages") {
        c.block.num_stages = i;
      } else if (persistent) {  // 1 on, -1 off (BlockConfig: 1, 0), 0 the default
        if (i != 0) c.block.params[key] = i == 1 ? 1 : 0;
      } else if (i != 0) {  // 0: the default
        c.block.params[key] = i;
      }
    }
  }
  return c;
}

// A forward call's tensors and options from the binding's arguments (flex_attention_into and
// the context-parallel forward take the same ones): q, k, v and out as floating-point tensors,
// lse as f32, the mods' bindings, scale, stream and the parsed config applied.
struct ForwardCall {
  TensorRef q, k, v, out;
  std::optional<TensorRef> lse;
  AttentionOptions options;
};

ForwardCall forward_call(const Array& q, const Array& k, const Array& v, const Array& out,
                         const std::optional<Array>& lse, const Mods& mods,
                         const std::vector<std::pair<std::string, Array>>& buffers,
                         const std::vector<std::pair<std::string, double>>& params,
                         std::optional<float> scale, uintptr_t stream, const CallConfig& cfg) {
  ForwardCall c;
  c.q = to_tensor(q, "q", kTakesQkv);
  c.k = to_tensor(k, "k", kTakesQkv);
  c.v = to_tensor(v, "v", kTakesQkv);
  c.out = to_tensor(out, "out", kTakesFloat);
  if (lse) c.lse = to_tensor(*lse, "lse", kTakesF32);
  c.options.mods = mods;
  c.options.bindings = to_bindings(mods, buffers, params);
  c.options.scale = scale;
  c.options.return_lse = c.lse.has_value();
  c.options.stream = reinterpret_cast<void*>(stream);
  cfg.apply(c.options);
  return c;
}

// The same for a backward call: q, k, v, out and dout floating-point, lse f32.
struct BackwardCall {
  TensorRef q, k, v, out, lse, dout;
  AttentionOptions options;
};

BackwardCall backward_call(const Array& q, const Array& k, const Array& v, const Array& out,
                           const Array& lse, const Array& dout, const Mods& mods,
                           const std::vector<std::pair<std::string, Array>>& buffers,
                           const std::vector<std::pair<std::string, double>>& params,
                           std::optional<float> scale, uintptr_t stream, const CallConfig& cfg) {
  BackwardCall c;
  c.q = to_tensor(q, "q", kTakesFloat);
  c.k = to_tensor(k, "k", kTakesFloat);
  c.v = to_tensor(v, "v", kTakesFloat);
  c.out = to_tensor(out, "out", kTakesFloat);
  c.lse = to_tensor(lse, "lse", kTakesF32);
  c.dout = to_tensor(dout, "dout", kTakesFloat);
  c.options.mods = mods;
  c.options.bindings = to_bindings(mods, buffers, params);
  c.options.scale = scale;
  c.options.stream = reinterpret_cast<void*>(stream);
  cfg.apply(c.options);
  return c;
}

// --- block masks from a framework's arrays ---------------------------------------------------

// The Python arrays a borrowed DeviceBlockMask views, released with the GIL held (whichever
// thread drops the mask's last copy) and never after the interpreter is gone.
struct BorrowedArrays {
  std::vector<Array> arrays;
};

std::shared_ptr<void> owner_of(std::vector<Array> arrays) {
  return std::shared_ptr<void>(new BorrowedArrays{std::move(arrays)}, [](void* p) noexcept {
    auto* owned = static_cast<BorrowedArrays*>(p);
    if (!Py_IsInitialized()) return;  // at exit: the memory goes with the process
    nb::gil_scoped_acquire gil;
    delete owned;
  });
}

// A view of one of a GPU mask's arrays that keeps the mask alive (a DLPack array of no
// framework: torch.from_dlpack, cupy.from_dlpack ... import it without a copy).
nb::object device_view(const std::shared_ptr<DeviceBlockMask>& mask, const DeviceTensor& t) {
  if (!t.defined()) return nb::none();
  const TensorRef& r = t.ref();
  std::vector<size_t> shape(r.shape.begin(), r.shape.end());
  auto* keep = new std::shared_ptr<DeviceBlockMask>(mask);
  nb::capsule owner(
      keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<DeviceBlockMask>*>(p); });
  nb::ndarray<int32_t, nb::device::cuda> a(r.data, shape.size(), shape.data(), owner, nullptr,
                                           nb::dtype<int32_t>(), nb::device::cuda::value,
                                           r.device_index);
  return nb::cast(a);
}

nb::ndarray<nb::numpy, int32_t> int_array(const std::vector<int32_t>& v,
                                          std::vector<size_t> shape) {
  size_t n = 1;
  for (size_t e : shape)
    n *= e;
  if (v.size() != n) {  // a host mask missing an array: never hand out memory past its end
    throw InternalError("a block mask array has " + std::to_string(v.size()) +
                        " elements where its shape needs " + std::to_string(n));
  }
  auto* copy = new std::vector<int32_t>(v);
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
  return nb::ndarray<nb::numpy, int32_t>(copy->data(), shape.size(), shape.data(), owner);
}

// --- context parallelism (context_parallel.h) -------------------------------------------------

nb::dlpack::dtype dlpack_dtype(DType d) {
  using Code = nb::dlpack::dtype_code;
  switch (d) {
    case DType::F32:
      return nb::dtype<float>();
    case DType::F16:
      return {static_cast<uint8_t>(Code::Float), 16, 1};
    case DType::BF16:
      return {static_cast<uint8_t>(Code::Bfloat), 16, 1};
    case DType::I32:
      return nb::dtype<int32_t>();
    case DType::Bool:
      return {static_cast<uint8_t>(Code::Bool), 8, 1};
    case DType::E4M3:
      return {static_cast<uint8_t>(Code::Float8_E4M3FN), 8, 1};
  }
  throw InternalError("dlpack_dtype: unknown DType " + std::to_string(static_cast<int>(d)));
}

// A DLPack array of no framework over a GPU tensor that flexjit allocated: the array owns it
// (the memory is freed with the array; torch.from_dlpack imports it without a copy).
nb::object owned_device_array(DeviceTensor t) {
  auto* keep = new DeviceTensor(std::move(t));
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<DeviceTensor*>(p); });
  const TensorRef& r = keep->ref();
  std::vector<size_t> shape(r.shape.begin(), r.shape.end());
  nb::ndarray<nb::device::cuda> a(r.data, shape.size(), shape.data(), owner, nullptr,
                                  dlpack_dtype(r.dtype), nb::device::cuda::value, r.device_index);
  return nb::cast(a);
}

nb::ndarray<nb::numpy, float> f32_array(std::vector<float> v, std::vector<size_t> shape) {
  auto* copy = new std::vector<float>(std::move(v));
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return nb::ndarray<nb::numpy, float>(copy->data(), shape.size(), shape.data(), owner);
}

ContextParallelOptions cp_options(const std::string& strategy, const std::string& layout) {
  ContextParallelOptions o;
  const std::optional<CpStrategy> s = parse_cp_strategy(strategy);
  if (!s) {
    throw RuntimeError("strategy '" + strategy +
                       "': context parallelism has 'ring' and 'allgather' "
                       "(docs/context_parallel.md, Strategies)");
  }
  const std::optional<CpLayout> l = parse_cp_layout(layout);
  if (!l) {
    throw RuntimeError("layout '" + layout +
                       "': context parallelism cuts the sequence 'zigzag' or 'contiguous' "
                       "(docs/context_parallel.md, Sharding)");
  }
  o.strategy = *s;
  o.layout = *l;
  return o;
}

// The context of a context-parallel call's device: CUDA tensors only.
Context& cp_context(const TensorRef& q, const char* call) {
  if (q.device != TensorRef::Device::CUDA) {
    throw RuntimeError(std::string(call) + ": q is " + q.str() +
                       "; context parallelism over NCCL takes CUDA tensors (the CPU check of "
                       "the partitioning is flex_attention_cp_cpu)");
  }
  return context_for(q.device_index);
}

}  // namespace
}  // namespace flexjit

NB_MODULE(_flexjit, m) {
  using namespace flexjit;
  m.doc() = "flexjit's C++ core; use the `flexjit` package, not this module directly.";
  m.attr("__version__") = FLEXJIT_VERSION_STRING;

  // Errors: flexjit.Error and its subclasses. Translators run newest first, so the base class
  // is registered first.
  nb::exception<Error> error(m, "Error");
  nb::exception<CompileError>(m, "CompileError", error);
  nb::exception<UnsupportedError>(m, "UnsupportedError", error);
  nb::exception<JitError>(m, "JitError", error);
  nb::exception<CacheError>(m, "CacheError", error);
  nb::exception<RuntimeError>(m, "RuntimeError", error);
  nb::exception<InternalError>(m, "InternalError");

  // --- the expression language ---
  nb::class_<Expr> expr(m, "Expr", "An immutable, typed expression of the mod language.");
  expr.def_prop_ro(
          "type", [](const Expr& e) { return std::string(to_string(e.type())); },
          "'f32', 'i32' or 'bool'")
      .def("__str__", &Expr::str)
      .def("__repr__", [](const Expr& e) { return "Expr(" + e.str() + ")"; })
      .def("same_as", &Expr::same_as, "Pointer identity (structural equality: Mods equality).");
  def_operators(expr);

  nb::class_<BufferIndex> bufidx(m, "BufferIndex",
                                 "A buffer indexed in fewer dims than it has: index it further.");
  bufidx.def("__getitem__", [](const BufferIndex& bi, nb::handle i) -> nb::object {
    BufferIndex next = bi;
    next.indices.push_back(to_expr(i));
    if (static_cast<int>(next.indices.size()) == next.buffer.rank())
      return nb::cast(next.buffer(next.indices));
    return nb::cast(next);
  });
  def_operators(bufidx);

  nb::class_<Buffer>(m, "Buffer",
                     "A captured buffer: a tensor of `dtype` with 1 to 4 dims, indexed by "
                     "expressions. `dims` name each extent ('H', 'Sq', '8192').")
      .def(
          "__init__",
          [](Buffer* self, std::string name, const std::string& dtype,
             std::vector<std::string> dims) {
            auto dt = parse_dtype(dtype);
            if (!dt)
              throw CompileError("unknown dtype '" + dtype + "' (f32, f16, bf16, i32, bool)");
            new (self) Buffer(std::move(name), *dt, std::move(dims));
          },
          "name"_a, "dtype"_a, "dims"_a)
      .def_prop_ro("name", &Buffer::name)
      .def_prop_ro("dtype", [](const Buffer& b) { return std::string(to_string(b.dtype())); })
      .def_prop_ro("rank", &Buffer::rank)
      .def("__getitem__",
           [](const Buffer& b, nb::handle i) -> nb::object {
             std::vector<Expr> idx;
             if (nb::isinstance<nb::tuple>(i)) {
               for (nb::handle x : nb::borrow<nb::tuple>(i))
                 idx.push_back(to_expr(x));
             } else {
               idx.push_back(to_expr(i));
             }
             if (static_cast<int>(idx.size()) >= b.rank()) return nb::cast(b(idx));
             return nb::cast(BufferIndex{b, idx});
           })
      .def("__repr__", [](const Buffer& b) {
        return "Buffer('" + b.name() + "', " + std::string(to_string(b.dtype())) + ", rank " +
               std::to_string(b.rank()) + ")";
      });

  nb::class_<Param> param(m, "Param",
                          "A runtime scalar parameter: its value is a kernel argument, so "
                          "changing it never recompiles.");
  param
      .def(
          "__init__",
          [](Param* self, std::string name, const std::string& type,
             std::optional<double> default_value) {
            auto t = parse_scalar_type(type);
            if (!t) throw CompileError("unknown param type '" + type + "' (f32, i32, bool)");
            new (self) Param(std::move(name), *t, default_value);
          },
          "name"_a, "type"_a = "f32", "default"_a = nb::none())
      .def_prop_ro("name", &Param::name)
      .def_prop_ro("type", [](const Param& p) { return std::string(to_string(p.type())); })
      .def("expr", &Param::expr)
      .def("__repr__", [](const Param& p) {
        return "Param('" + p.name() + "', " + std::string(to_string(p.type())) + ")";
      });
  def_operators(param);

  m.def("score", &flexjit::score, "f32: scale * q·k at (q_idx, kv_idx)");
  m.def("b_idx", &flexjit::b_idx, "i32: batch index");
  m.def("h_idx", &flexjit::h_idx, "i32: query head index");
  m.def("q_idx", &flexjit::q_idx, "i32: query position");
  m.def("kv_idx", &flexjit::kv_idx, "i32: key/value position");
  auto unary = [&](const char* name, Expr (*f)(Expr), const char* doc) {
    m.def(
        name, [f](nb::handle a) { return f(to_expr(a)); }, "a"_a, doc);
  };
  unary("abs", &flexjit::abs, "|a|");
  unary("exp", &flexjit::exp, "e^a");
  unary("exp2", &flexjit::exp2, "2^a");
  unary("log", &flexjit::log, "natural log");
  unary("log2", &flexjit::log2, "base-2 log");
  unary("tanh", &flexjit::tanh, "tanh");
  unary("sigmoid", &flexjit::sigmoid, "1 / (1 + e^-a)");
  unary("sqrt", &flexjit::sqrt, "square root");
  unary("rsqrt", &flexjit::rsqrt, "1 / sqrt(a)");
  unary("floor", &flexjit::floor, "round down (f32)");
  unary("ceil", &flexjit::ceil, "round up (f32)");
  unary("to_float", &flexjit::to_float, "float(a)");
  unary("to_int", &flexjit::to_int, "int(a): truncates toward zero, like C");
  m.def(
      "where",
      [](nb::handle c, nb::handle a, nb::handle b) {
        return where(to_expr(c), to_expr(a), to_expr(b));
      },
      "cond"_a, "a"_a, "b"_a, "cond ? a : b");
  m.def(
      "min", [](nb::handle a, nb::handle b) { return min(to_expr(a), to_expr(b)); }, "a"_a, "b"_a);
  m.def(
      "max", [](nb::handle a, nb::handle b) { return max(to_expr(a), to_expr(b)); }, "a"_a, "b"_a);
  m.def(
      "pow", [](nb::handle a, nb::handle b) { return pow(to_expr(a), to_expr(b)); }, "a"_a, "b"_a);
  m.def(
      "as_expr", [](nb::handle a) { return to_expr(a); }, "a"_a,
      "The operand as an Expr (ints are i32, floats f32).");

  // --- mods ---
  nb::class_<Mods>(m, "Mods",
                   "A score_mod, a mask_mod and/or a sink_mod with the buffers and parameters "
                   "they capture.")
      .def(
          "__init__",
          [](Mods* self, std::optional<Expr> score_mod, std::optional<Expr> mask_mod,
             std::optional<std::string> name, std::optional<Expr> sink_mod) {
            ScoreModFn s;
            MaskModFn k;
            SinkModFn sink;
            if (score_mod) s = [&](Expr, Expr, Expr, Expr, Expr) { return *score_mod; };
            if (mask_mod) k = [&](Expr, Expr, Expr, Expr) { return *mask_mod; };
            if (sink_mod) sink = [&](Expr, Expr, Expr) { return *sink_mod; };
            new (self) Mods(Mods::from(s, k, sink));
            if (name) self->name = *name;
          },
          "score_mod"_a = nb::none(), "mask_mod"_a = nb::none(), "name"_a = nb::none(),
          "sink_mod"_a = nb::none(),
          "Mods from expressions (buffers and params are collected from them). sink_mod: an "
          "attention sink, one f32 logit per row (b, h, q_idx) in the softmax denominator.")
      .def_prop_ro("score_mod",
                   [](const Mods& m) -> std::optional<Expr> {
                     if (m.score_mod.defined()) return m.score_mod;
                     return std::nullopt;
                   })
      .def_prop_ro("mask_mod",
                   [](const Mods& m) -> std::optional<Expr> {
                     if (m.mask_mod.defined()) return m.mask_mod;
                     return std::nullopt;
                   })
      .def_prop_ro("sink_mod",
                   [](const Mods& m) -> std::optional<Expr> {
                     if (m.sink_mod.defined()) return m.sink_mod;
                     return std::nullopt;
                   })
      .def_ro("buffers", &Mods::buffers)
      .def_ro("params", &Mods::params)
      .def_rw("name", &Mods::name)
      .def("check", &Mods::check, "Type checks both mods; raises CompileError.")
      .def("to_text", &Mods::to_text, "The mods as `.fx` text (parses back to equal Mods).")
      .def("hash", &Mods::hash,
           "Structural hash (ignores parameter values, buffer contents and the name).")
      .def("__hash__", [](const Mods& m) { return static_cast<Py_hash_t>(m.hash() >> 1); })
      .def("__eq__", [](const Mods& a, const Mods& b) { return equal(a, b); })
      .def("__repr__", [](const Mods& m) { return "Mods(" + m.name + "):\n" + m.to_text(); });

  m.def("parse_mods", &parse_mods, "text"_a, "file"_a = "<inline>", "Parses `.fx` text.");
  m.def("load_mods_file", &load_mods_file, "path"_a);
  m.def("standard_mod_names", &standard_mod_names, "The standard mods shipped in dsl/.");
  m.def("standard_mod_source", &standard_mod_source, "name"_a);
  m.def("standard_mods", &standard_mods, "name"_a, "A standard mod set by name ('causal').");
  m.def("combine", &combine, "a"_a, "b"_a,
        "The score_mod and sink_mod of whichever has one, the mask_mods ANDed, buffers and "
        "params united.");

  // --- block masks ---
  nb::class_<PyBlockMask>(m, "BlockMask",
                          "Which (query tile, key tile) pairs attention visits; built by "
                          "create_block_mask on the CPU or a GPU.")
      .def_prop_ro("shape",
                   [](const PyBlockMask& b) {
                     const BlockMask& m = b.meta();
                     return std::vector<int>{m.batch, m.heads, m.seqlen_q, m.seqlen_kv};
                   })
      .def_prop_ro("block_size",
                   [](const PyBlockMask& b) {
                     return std::make_pair(b.meta().q_block_size, b.meta().kv_block_size);
                   })
      .def_prop_ro("device",
                   [](const PyBlockMask& b) {
                     return b.device_index < 0 ? std::string("cpu")
                                               : "cuda:" + std::to_string(b.device_index);
                   })
      .def_prop_ro("mods", [](const PyBlockMask& b) { return b.meta().mods; })
      .def(
          "density", [](const PyBlockMask& b) { return b.to_host().density(); },
          "Fraction of tiles computed (partial or full).")
      .def(
          "to_string",
          [](const PyBlockMask& b, int batch, int head, int max_width) {
            return to_picture(b.to_host(), batch, head, max_width);
          },
          "b"_a = 0, "h"_a = 0, "max_width"_a = 80,
          "A text picture of tile (b, h): '█' full, '░' partial, '·' empty.")
      .def(
          "arrays",
          [](const PyBlockMask& b) {
            const BlockMask h = b.to_host();
            const size_t B = h.batch, H = h.heads, nq = h.num_q_blocks, nk = h.num_kv_blocks;
            nb::dict d;
            d["kv_num_blocks"] = int_array(h.kv_num_blocks, {B, H, nq});
            d["kv_indices"] = int_array(h.kv_indices, {B, H, nq, nk});
            d["full_kv_num_blocks"] = int_array(h.full_kv_num_blocks, {B, H, nq});
            d["full_kv_indices"] = int_array(h.full_kv_indices, {B, H, nq, nk});
            return d;
          },
          "The kv_* arrays as NumPy int32 arrays (FlexAttention's layout).")
      .def(
          "views",
          [](const PyBlockMask& b) {
            nb::dict d;
            if (b.device) {
              const std::shared_ptr<DeviceBlockMask>& m = b.device;
              d["kv_num_blocks"] = device_view(m, m->kv_num_blocks);
              d["kv_indices"] = device_view(m, m->kv_indices);
              d["full_kv_num_blocks"] = device_view(m, m->full_kv_num_blocks);
              d["full_kv_indices"] = device_view(m, m->full_kv_indices);
              d["q_num_blocks"] = device_view(m, m->q_num_blocks);
              d["q_indices"] = device_view(m, m->q_indices);
              d["full_q_num_blocks"] = device_view(m, m->full_q_num_blocks);
              d["full_q_indices"] = device_view(m, m->full_q_indices);
              return d;
            }
            const BlockMask& h = b.host;  // complete: from_arrays and the builders fill all 8
            const size_t B = h.batch, H = h.heads, nq = h.num_q_blocks, nk = h.num_kv_blocks;
            d["kv_num_blocks"] = int_array(h.kv_num_blocks, {B, H, nq});
            d["kv_indices"] = int_array(h.kv_indices, {B, H, nq, nk});
            d["full_kv_num_blocks"] = int_array(h.full_kv_num_blocks, {B, H, nq});
            d["full_kv_indices"] = int_array(h.full_kv_indices, {B, H, nq, nk});
            d["q_num_blocks"] = int_array(h.q_num_blocks, {B, H, nk});
            d["q_indices"] = int_array(h.q_indices, {B, H, nk, nq});
            d["full_q_num_blocks"] = int_array(h.full_q_num_blocks, {B, H, nk});
            d["full_q_indices"] = int_array(h.full_q_indices, {B, H, nk, nq});
            return d;
          },
          "The 8 arrays (kv_num_blocks, kv_indices, full_kv_*, q_*, full_q_*) by name: for a GPU "
          "mask zero-copy DLPack views of its device memory that keep the mask alive "
          "(torch.from_dlpack(v) imports one; None where the mask has no such array: full_* "
          "without full tiles), for a CPU mask NumPy int32 copies.")
      .def(
          "arrays_changed",
          [](const PyBlockMask& b) {
            if (b.device) b.device->arrays_changed();
          },
          "After writing into a GPU mask's arrays in place (through views() or the arrays it "
          "was made from), before the next call: the calls derive their schedules again.")
      .def("__repr__", [](const PyBlockMask& b) { return b.meta().str(); });

  m.def(
      "_block_mask_from_arrays",
      [](std::optional<Array> kv_num_blocks, std::optional<Array> kv_indices,
         std::optional<Array> full_kv_num_blocks, std::optional<Array> full_kv_indices,
         std::optional<Array> q_num_blocks, std::optional<Array> q_indices,
         std::optional<Array> full_q_num_blocks, std::optional<Array> full_q_indices, int seqlen_q,
         int seqlen_kv, int q_block_size, int kv_block_size, const Mods& mods, bool validate) {
        const std::optional<Array>* given[8] = {
            &kv_num_blocks, &kv_indices, &full_kv_num_blocks, &full_kv_indices,
            &q_num_blocks,  &q_indices,  &full_q_num_blocks,  &full_q_indices};
        const char* names[8] = {"kv_num_blocks",     "kv_indices",    "full_kv_num_blocks",
                                "full_kv_indices",   "q_num_blocks",  "q_indices",
                                "full_q_num_blocks", "full_q_indices"};
        std::array<TensorRef, 8> refs;
        BlockMaskArrayRefs views;
        const TensorRef** slots[8] = {&views.kv_num_blocks,      &views.kv_indices,
                                      &views.full_kv_num_blocks, &views.full_kv_indices,
                                      &views.q_num_blocks,       &views.q_indices,
                                      &views.full_q_num_blocks,  &views.full_q_indices};
        for (int i = 0; i < 8; ++i) {
          if (!*given[i]) continue;
          refs[i] = to_tensor(**given[i], names[i], kTakesInt32);
          *slots[i] = &refs[i];
        }
        BlockMask meta = block_mask_meta(views, seqlen_q, seqlen_kv, q_block_size, kv_block_size);
        meta.mods = mods;
        auto out = std::make_unique<PyBlockMask>();
        if (refs[0].device == TensorRef::Device::CPU) {
          // A host mask: the arrays copied (C-contiguous int32, checked above), the absent ones
          // filled in, the whole validated.
          BlockMask h = meta;
          std::vector<int32_t>* fields[8] = {
              &h.kv_num_blocks, &h.kv_indices, &h.full_kv_num_blocks, &h.full_kv_indices,
              &h.q_num_blocks,  &h.q_indices,  &h.full_q_num_blocks,  &h.full_q_indices};
          for (int i = 0; i < 8; ++i) {
            if (*slots[i] == nullptr) continue;
            const auto* p = static_cast<const int32_t*>(refs[i].data);
            fields[i]->assign(p, p + refs[i].numel());
          }
          if (!views.full_kv_num_blocks) {  // no full tiles: zero counts, indices ascending
            const size_t rows = static_cast<size_t>(h.batch) * h.heads * h.num_q_blocks;
            h.full_kv_num_blocks.assign(rows, 0);
            h.full_kv_indices.resize(rows * h.num_kv_blocks);
            for (size_t r = 0; r < rows; ++r) {
              for (int c = 0; c < h.num_kv_blocks; ++c)
                h.full_kv_indices[r * h.num_kv_blocks + c] = c;
            }
          }
          if (!views.q_num_blocks || !views.full_q_num_blocks) {
            BlockMask t = h;
            t.build_transposed();  // checks kv_* first
            if (!views.q_num_blocks) {
              h.q_num_blocks = std::move(t.q_num_blocks);
              h.q_indices = std::move(t.q_indices);
            }
            if (!views.full_q_num_blocks) {
              h.full_q_num_blocks = std::move(t.full_q_num_blocks);
              h.full_q_indices = std::move(t.full_q_indices);
            }
          }
          h.validate();
          out->host = std::move(h);
          return out;
        }
        // A GPU mask over the arrays' own memory: the arrays stay referenced while it lives.
        DeviceBlockMaskArrays arrays;
        DeviceTensor* fields[8] = {&arrays.kv_num_blocks,      &arrays.kv_indices,
                                   &arrays.full_kv_num_blocks, &arrays.full_kv_indices,
                                   &arrays.q_num_blocks,       &arrays.q_indices,
                                   &arrays.full_q_num_blocks,  &arrays.full_q_indices};
        std::vector<Array> keep;
        for (int i = 0; i < 8; ++i) {
          if (*given[i]) keep.push_back(**given[i]);
        }
        const std::shared_ptr<void> owner = owner_of(std::move(keep));
        for (int i = 0; i < 8; ++i) {
          if (*slots[i] != nullptr) *fields[i] = DeviceTensor::borrow(refs[i], owner);
        }
        const int device = refs[0].device_index;
        {
          nb::gil_scoped_release release;
          Context& ctx = context_for(device);
          out->device = std::make_shared<DeviceBlockMask>(
              DeviceBlockMask::from_arrays(ctx, meta, std::move(arrays), validate));
        }
        out->device_index = device;
        out->host = out->device->meta();
        return out;
      },
      "kv_num_blocks"_a.none(), "kv_indices"_a.none(), "full_kv_num_blocks"_a.none(),
      "full_kv_indices"_a.none(), "q_num_blocks"_a.none(), "q_indices"_a.none(),
      "full_q_num_blocks"_a.none(), "full_q_indices"_a.none(), "seqlen_q"_a, "seqlen_kv"_a,
      "q_block_size"_a, "kv_block_size"_a, "mods"_a, "validate"_a = false,
      "A BlockMask over int32 arrays in the layouts of block_mask.h (docs/python.md, Block "
      "masks): CUDA arrays are used in place (borrowed, kept alive by the mask), CPU arrays "
      "copied into a host mask and validated. Absent q_* / full_q_* are computed from kv_*.");

  m.def(
      "_create_block_mask",
      [](const Mods& mods, int batch, int heads, int seqlen_q, int seqlen_kv, int device,
         int block_size, const std::vector<std::pair<std::string, Array>>& buffers,
         const std::vector<std::pair<std::string, double>>& params) {
        const ModBindings b =
            to_bindings(mods.mask_mod.defined() ? mask_only(mods) : mods, buffers, params);
        auto out = std::make_unique<PyBlockMask>();
        nb::gil_scoped_release release;
        if (device < 0) {
          out->host = cpu::build_block_mask_interpreted(mods, batch, heads, seqlen_q, seqlen_kv,
                                                        block_size, b);
        } else {
          Context& ctx = context_for(device);
          out->device = std::make_shared<DeviceBlockMask>(
              create_block_mask(ctx, mods, batch, heads, seqlen_q, seqlen_kv, block_size, b));
          out->device_index = device;
          out->host = out->device->meta();
        }
        return out;
      },
      "mods"_a, "batch"_a, "heads"_a, "seqlen_q"_a, "seqlen_kv"_a, "device"_a, "block_size"_a,
      "buffers"_a, "params"_a);

  // --- attention ---
  m.def(
      "_output_shapes",
      [](const Array& q, const Array& k, const Array& v) {
        const QkvShape s =
            validate_forward_qkv(to_tensor(q, "q", kTakesQkv), to_tensor(k, "k", kTakesQkv),
                                 to_tensor(v, "v", kTakesQkv));
        return std::make_pair(std::vector<int64_t>{s.batch, s.heads_q, s.seqlen_q, s.head_dim_v},
                              std::vector<int64_t>{s.batch, s.heads_q, s.seqlen_q});
      },
      "q"_a, "k"_a, "v"_a, "Validates q, k, v and returns the shapes of out and lse.");
  m.def(
      "_flex_attention_into",
      [](const Array& q, const Array& k, const Array& v, const Array& out, std::optional<Array> lse,
         const Mods& mods, const PyBlockMask* block_mask,
         const std::vector<std::pair<std::string, Array>>& buffers,
         const std::vector<std::pair<std::string, double>>& params, std::optional<float> scale,
         uintptr_t stream, int num_threads, std::optional<Array> seq_lens,
         std::optional<Array> page_table, bool check_pages, std::optional<nb::dict> config,
         std::optional<Array> q_descale, std::optional<Array> k_descale,
         std::optional<Array> v_descale, std::optional<Array> k_scale,
         std::optional<Array> v_scale) {
        const CallConfig cfg = parse_config(config, /*backward=*/false);
        // cfg applies to the GPU kernels only: the CPU backend has one kernel, always exact.
        ForwardCall call =
            forward_call(q, k, v, out, lse, mods, buffers, params, scale, stream, cfg);
        // e4m3 q, k, v: their descale factors (AttentionOptions::descale; checked in the call).
        if (q_descale) call.options.descale.q = to_tensor(*q_descale, "q_descale", kTakesF32);
        if (k_descale) call.options.descale.k = to_tensor(*k_descale, "k_descale", kTakesF32);
        if (v_descale) call.options.descale.v = to_tensor(*v_descale, "v_descale", kTakesF32);
        const TensorRef &tq = call.q, &tk = call.k, &tv = call.v, &tout = call.out;
        const std::optional<TensorRef>& tlse = call.lse;
        AttentionOptions& o = call.options;
        // A KV cache (paged_kv.h): ragged lengths, and pools read through a page table; an
        // e4m3 cache's per-kv-head scales (validate_kv_cache checks them against k and v).
        KvCache cache;
        if ((k_scale || v_scale) && !seq_lens && !page_table) {
          throw RuntimeError(std::string(k_scale ? "k_scale" : "v_scale") +
                             " given without seq_lens or page_table: k_scale / v_scale "
                             "dequantize an e4m3 KV cache (give its seq_lens, and page_table for "
                             "page pools); e4m3 q, k, v of the forward take "
                             "descale=(q_descale, k_descale, v_descale)");
        }
        if (seq_lens || page_table) {
          if (seq_lens) cache.seq_lens = to_tensor(*seq_lens, "seq_lens", kTakesInt32);
          if (page_table) cache.page_table = to_tensor(*page_table, "page_table", kTakesInt32);
          if (k_scale) cache.k_scale = to_tensor(*k_scale, "k_scale", kTakesF32);
          if (v_scale) cache.v_scale = to_tensor(*v_scale, "v_scale", kTakesF32);
          cache.check_pages = check_pages;
          o.kv_cache = &cache;
        }
        nb::gil_scoped_release release;
        if (tq.device == TensorRef::Device::CPU) {
          check_cpu_block_mask(block_mask, tq, tk, o.kv_cache != nullptr);
          o.mods = cpu_mods(o.mods, block_mask);
          CpuRunOptions cpu;
          cpu.num_threads = num_threads;
          flex_attention_cpu_into(tq, tk, tv, tout, tlse ? &*tlse : nullptr, o, cpu);
          return;
        }
        Context& ctx = context_for(tq.device_index);
        std::optional<DeviceBlockMask> uploaded;
        o.block_mask = device_block_mask(ctx, tq.device_index, block_mask, uploaded);
        flex_attention_into(ctx, tq, tk, tv, tout, tlse ? &*tlse : nullptr, o);
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "mods"_a, "block_mask"_a.none(), "buffers"_a,
      "params"_a, "scale"_a.none(), "stream"_a, "num_threads"_a, "seq_lens"_a.none() = nb::none(),
      "page_table"_a.none() = nb::none(), "check_pages"_a = false, "config"_a.none() = nb::none(),
      "q_descale"_a.none() = nb::none(), "k_descale"_a.none() = nb::none(),
      "v_descale"_a.none() = nb::none(), "k_scale"_a.none() = nb::none(),
      "v_scale"_a.none() = nb::none());

  m.def(
      "_flex_attention_backward_into",
      [](const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
         const Array& dout, const std::optional<Array>& dlse, const Array& dq, const Array& dk,
         const Array& dv, const Mods& mods, const PyBlockMask* block_mask,
         const std::vector<std::pair<std::string, Array>>& buffers,
         const std::vector<std::pair<std::string, double>>& params,
         const std::vector<std::pair<std::string, Array>>& buffer_grads, std::optional<float> scale,
         uintptr_t stream, int num_threads, bool deterministic, std::optional<nb::dict> config) {
        const CallConfig cfg = parse_config(config, /*backward=*/true);
        BackwardCall call =
            backward_call(q, k, v, out, lse, dout, mods, buffers, params, scale, stream, cfg);
        const TensorRef &tq = call.q, &tk = call.k, &tv = call.v, &tout = call.out,
                        &tlse = call.lse, &tdout = call.dout;
        AttentionOptions& o = call.options;
        BackwardOutputs g{to_tensor(dq, "dq", kTakesFloat),
                          to_tensor(dk, "dk", kTakesFloat),
                          to_tensor(dv, "dv", kTakesFloat),
                          {}};
        for (const auto& [name, a] : buffer_grads)
          g.buffer_grads.emplace_back(
              name, to_tensor(a, "the gradient of buffer '" + name + "'", kTakesF32));
        std::optional<TensorRef> tdlse;
        if (dlse) tdlse = to_tensor(*dlse, "dlse", kTakesF32);
        nb::gil_scoped_release release;
        if (tq.device == TensorRef::Device::CPU) {
          // The CPU backend's fp32 backward (f32 outputs, contiguous; out and lse as its forward
          // writes them).
          // The CPU backward reads out / lse / dlse as raw f32 rows: check them here.
          // (q / v of another rank: cpu_attention_backward names the problem.)
          const bool ranked = tq.shape.size() == 4 && tv.shape.size() == 4;
          const int64_t B = ranked ? tq.shape[0] : 0, Hq = ranked ? tq.shape[1] : 0,
                        Sq = ranked ? tq.shape[2] : 0, Dv = ranked ? tv.shape[3] : 0;
          auto check_f32 = [](const TensorRef& t, const char* name,
                              const std::vector<int64_t>& shape) {
            if (t.dtype != DType::F32 || t.device != TensorRef::Device::CPU || t.shape != shape ||
                !t.is_contiguous()) {
              std::string want;
              for (int64_t e : shape)
                want += (want.empty() ? "" : ", ") + std::to_string(e);
              throw RuntimeError(std::string("flex_attention_backward (CPU): ") + name + " is " +
                                 t.str() + "; expected f32 [" + want +
                                 "] on the cpu, contiguous (as the CPU forward returns it)");
            }
          };
          check_cpu_block_mask(block_mask, tq, tk, /*kv_cache=*/false);
          if (ranked) {
            check_f32(tout, "out", {B, Hq, Sq, Dv});
            check_f32(tlse, "lse", {B, Hq, Sq});
            if (tdlse) check_f32(*tdlse, "dlse", {B, Hq, Sq});
          }
          if (o.check_buffers && ranked && tk.shape.size() == 4) {  // as the CPU forward
            const Mods m = cpu_mods(o.mods, block_mask);
            const runtime::CallExtents e{B, Hq, tk.shape[1], Sq, tk.shape[2]};
            cpu::check_buffer_indices(
                m, runtime::bind_mod_args(m, o.bindings, TensorRef::Device::CPU), e);
          }
          cpu::CpuBackwardOptions bo;
          if (scale) bo.scale = *scale;
          bo.num_threads = num_threads;
          if (tdlse) bo.dlse = static_cast<const float*>(tdlse->data);
          const cpu::CpuGradients<float> r =
              cpu::cpu_attention_backward(cpu_mods(o.mods, block_mask), o.bindings, tq, tk, tv,
                                          static_cast<const float*>(tout.data),
                                          static_cast<const float*>(tlse.data), tdout, bo);
          auto put = [](const TensorRef& t, const std::vector<float>& x) {
            std::memcpy(t.data, x.data(), x.size() * sizeof(float));
          };
          put(g.dq, r.dq);
          put(g.dk, r.dk);
          put(g.dv, r.dv);
          for (const auto& [name, t] : g.buffer_grads)
            put(t, r.buffers.at(name));
          return;
        }
        Context& ctx = context_for(tq.device_index);
        std::optional<DeviceBlockMask> uploaded;
        o.block_mask = device_block_mask(ctx, tq.device_index, block_mask, uploaded);
        BackwardOptions backward;
        if (tdlse) backward.dlse = &*tdlse;
        backward.deterministic = deterministic;
        backward.dq_mode = cfg.dq_mode;
        flex_attention_backward_into(ctx, tq, tk, tv, tout, tlse, tdout, g, o, backward);
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dout"_a, "dlse"_a.none(), "dq"_a, "dk"_a, "dv"_a,
      "mods"_a, "block_mask"_a.none(), "buffers"_a, "params"_a, "buffer_grads"_a, "scale"_a.none(),
      "stream"_a, "num_threads"_a, "deterministic"_a = false, "config"_a.none() = nb::none());

  // The backward's early start (flex_attention_backward_prepare): its kernels queued to build on
  // the device's context in the background; the arguments are _backward_into's that shape its
  // kernels. How many kernels it queued; 0 for CPU tensors.
  m.def(
      "_flex_attention_backward_prepare",
      [](const Array& q, const Array& k, const Array& v, const Mods& mods,
         const PyBlockMask* block_mask, const std::vector<std::pair<std::string, Array>>& buffers,
         const std::vector<std::pair<std::string, double>>& params, std::optional<float> scale,
         bool deterministic, std::optional<nb::dict> config) -> size_t {
        const CallConfig cfg = parse_config(config, /*backward=*/true);
        const TensorRef tq = to_tensor(q, "q", kTakesFloat);
        const TensorRef tk = to_tensor(k, "k", kTakesFloat);
        const TensorRef tv = to_tensor(v, "v", kTakesFloat);
        if (tq.device == TensorRef::Device::CPU) return 0;
        AttentionOptions o;
        o.mods = mods;
        o.bindings = to_bindings(mods, buffers, params);
        o.scale = scale;
        cfg.apply(o);
        BackwardOptions backward;
        backward.deterministic = deterministic;
        backward.dq_mode = cfg.dq_mode;
        nb::gil_scoped_release release;
        Context& ctx = context_for(tq.device_index);
        std::optional<DeviceBlockMask> uploaded;
        o.block_mask = device_block_mask(ctx, tq.device_index, block_mask, uploaded);
        return flex_attention_backward_prepare(ctx, tq, tk, tv, o, backward);
      },
      "q"_a, "k"_a, "v"_a, "mods"_a, "block_mask"_a.none(), "buffers"_a, "params"_a,
      "scale"_a.none(), "deterministic"_a = false, "config"_a.none() = nb::none());
  // The contexts are never destroyed (context_for): their background compiles are stopped at
  // interpreter exit, before anything they use is torn down.
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] {
    nb::gil_scoped_release release;
    KernelBuilder::stop_all_background();
  }));

  // --- context parallelism over NCCL (include/flexjit/context_parallel.h) ---
  m.def(
      "_nccl_available",
      [] {
        std::string reason;
        bool ok = false;
        {
          nb::gil_scoped_release release;
          ok = nccl_available(&reason);
        }
        return std::make_pair(ok, reason);
      },
      "(whether libnccl.so.2 loads, and otherwise every place tried and what each said).");
  nb::class_<NcclCommunicator>(
      m, "NcclCommunicator",
      "An NCCL communicator of one rank for the context-parallel calls (flexjit.distributed "
      "makes one per torch.distributed process group).")
      .def_static(
          "unique_id",
          [] {
            NcclUniqueId id;
            {
              nb::gil_scoped_release release;
              id = NcclCommunicator::unique_id();
            }
            return nb::bytes(id.bytes, sizeof(id.bytes));
          },
          "ncclGetUniqueId: 128 bytes, made on one rank and sent to the others.")
      .def_static(
          "create",
          [](int device, const nb::bytes& unique_id, int nranks, int rank) {
            NcclUniqueId id;
            if (unique_id.size() != sizeof(id.bytes)) {
              throw RuntimeError("NcclCommunicator.create: the unique id has " +
                                 std::to_string(unique_id.size()) + " bytes; NCCL's has " +
                                 std::to_string(sizeof(id.bytes)) +
                                 " (NcclCommunicator.unique_id() on one rank, sent to the others)");
            }
            std::memcpy(id.bytes, unique_id.c_str(), sizeof(id.bytes));
            nb::gil_scoped_release release;  // blocks until every rank joined
            return NcclCommunicator::create(context_for(device), id, nranks, rank);
          },
          "device"_a, "unique_id"_a, "nranks"_a, "rank"_a,
          "ncclCommInitRank on CUDA device `device`: every rank calls it with the same id; it "
          "returns once all have joined. The communicator is destroyed with the object.")
      .def_static(
          "wrap",
          [](uintptr_t comm) {
            return NcclCommunicator::wrap(reinterpret_cast<ncclComm*>(comm));  // NOLINT
          },
          "comm"_a,
          "The caller's ncclComm_t (its address as an int), not destroyed by flexjit: the caller "
          "keeps it alive while the object is used, and makes no other NCCL call on it "
          "concurrently.")
      .def_prop_ro("rank", &NcclCommunicator::rank)
      .def_prop_ro("size", &NcclCommunicator::size)
      .def("__repr__", [](const NcclCommunicator& c) {
        return "NcclCommunicator(rank=" + std::to_string(c.rank()) +
               ", size=" + std::to_string(c.size()) + ")";
      });
  m.def(
      "_flex_attention_cp_into",
      [](const NcclCommunicator& comm, const Array& q, const Array& k, const Array& v,
         const Array& out, std::optional<Array> lse, const Mods& mods,
         const std::vector<std::pair<std::string, Array>>& buffers,
         const std::vector<std::pair<std::string, double>>& params, std::optional<float> scale,
         uintptr_t stream, const std::string& strategy, const std::string& layout,
         std::optional<nb::dict> config) {
        const CallConfig cfg = parse_config(config, /*backward=*/false);
        const ContextParallelOptions cpo = cp_options(strategy, layout);
        ForwardCall call =
            forward_call(q, k, v, out, lse, mods, buffers, params, scale, stream, cfg);
        const TensorRef &tq = call.q, &tk = call.k, &tv = call.v, &tout = call.out;
        const std::optional<TensorRef>& tlse = call.lse;
        const AttentionOptions& o = call.options;
        nb::gil_scoped_release release;
        Context& ctx = cp_context(tq, "flex_attention_cp");
        flex_attention_cp_into(ctx, comm, tq, tk, tv, tout, tlse ? &*tlse : nullptr, o, cpo);
      },
      "comm"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "mods"_a, "buffers"_a, "params"_a,
      "scale"_a.none(), "stream"_a, "strategy"_a, "layout"_a, "config"_a.none() = nb::none(),
      "The rank's rows of the attention over the whole sequence into out (and lse), from its "
      "shards of q, k, v (CUDA arrays), enqueued on `stream`.");
  m.def(
      "_flex_attention_cp_backward",
      [](const NcclCommunicator& comm, const Array& q, const Array& k, const Array& v,
         const Array& out, const Array& lse, const Array& dout, const Mods& mods,
         const std::vector<std::pair<std::string, Array>>& buffers,
         const std::vector<std::pair<std::string, double>>& params, std::optional<float> scale,
         uintptr_t stream, const std::string& strategy, const std::string& layout,
         std::optional<nb::dict> config) {
        const CallConfig cfg = parse_config(config, /*backward=*/true);
        if (cfg.dq_mode != BackwardOptions::DqMode::Auto) {
          throw UnsupportedError(
              "config dq_mode: the context-parallel backward takes no BackwardOptions yet "
              "(docs/context_parallel.md, Not done yet); leave dq_mode out");
        }
        const ContextParallelOptions cpo = cp_options(strategy, layout);
        const BackwardCall call =
            backward_call(q, k, v, out, lse, dout, mods, buffers, params, scale, stream, cfg);
        const TensorRef &tq = call.q, &tk = call.k, &tv = call.v, &tout = call.out,
                        &tlse = call.lse, &tdout = call.dout;
        const AttentionOptions& o = call.options;
        BackwardResult g;
        {
          nb::gil_scoped_release release;
          Context& ctx = cp_context(tq, "flex_attention_cp_backward");
          g = flex_attention_cp_backward(ctx, comm, tq, tk, tv, tout, tlse, tdout, o, cpo);
        }
        nb::list grads;
        for (auto& [name, t] : g.buffer_grads)
          grads.append(nb::make_tuple(name, owned_device_array(std::move(t))));
        return nb::make_tuple(owned_device_array(std::move(g.dq)),
                              owned_device_array(std::move(g.dk)),
                              owned_device_array(std::move(g.dv)), grads);
      },
      "comm"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dout"_a, "mods"_a, "buffers"_a, "params"_a,
      "scale"_a.none(), "stream"_a, "strategy"_a, "layout"_a, "config"_a.none() = nb::none(),
      "(dq, dk, dv, [(buffer name, f32 gradient summed over the ranks)]) of the rank's shards: "
      "DLPack CUDA arrays that own flexjit's memory, written on `stream`.");
  m.def(
      "_flex_attention_cp_cpu",
      [](const Array& q, const Array& k, const Array& v, int ranks, const Mods& mods,
         const std::vector<std::pair<std::string, Array>>& buffers,
         const std::vector<std::pair<std::string, double>>& params, std::optional<float> scale,
         const std::string& strategy, const std::string& layout, int num_threads) {
        const ContextParallelOptions cpo = cp_options(strategy, layout);
        const TensorRef tq = to_tensor(q, "q", kTakesFloat), tk = to_tensor(k, "k", kTakesFloat),
                        tv = to_tensor(v, "v", kTakesFloat);
        if (tq.device != TensorRef::Device::CPU) {
          throw RuntimeError("flex_attention_cp_cpu: q is " + tq.str() +
                             "; the CPU check of context parallelism takes CPU tensors of the "
                             "whole sequence");
        }
        AttentionOptions o;
        o.mods = mods;
        o.bindings = to_bindings(mods, buffers, params);
        o.scale = scale;
        o.return_lse = true;
        CpuRunOptions cpu;
        cpu.num_threads = num_threads;
        CpuContextParallelResult r;
        {
          nb::gil_scoped_release release;
          r = flex_attention_cp_cpu(tq, tk, tv, ranks, o, cpo, cpu);
        }
        std::vector<size_t> shape(r.result.shape.begin(), r.result.shape.end());
        std::vector<size_t> lse_shape(shape.begin(), shape.end() - 1);
        return nb::make_tuple(f32_array(std::move(r.result.out), shape),
                              f32_array(std::move(r.result.lse), lse_shape), r.calls,
                              r.skipped_pairs, r.schedule);
      },
      "q"_a, "k"_a, "v"_a, "ranks"_a, "mods"_a, "buffers"_a, "params"_a, "scale"_a.none(),
      "strategy"_a, "layout"_a, "num_threads"_a = 0,
      "flex_attention_cp_cpu: the whole sequence's (out, lse) computed shard by shard on the CPU "
      "backend as `ranks` GPUs would, then calls made, pairs skipped and every rank's schedule.");
  m.def(
      "_flex_attention_cp_backward_cpu",
      [](const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
         const Array& dout, int ranks, const Mods& mods,
         const std::vector<std::pair<std::string, Array>>& buffers,
         const std::vector<std::pair<std::string, double>>& params, std::optional<float> scale,
         const std::string& strategy, const std::string& layout, int num_threads) {
        const ContextParallelOptions cpo = cp_options(strategy, layout);
        const TensorRef tq = to_tensor(q, "q", kTakesFloat), tk = to_tensor(k, "k", kTakesFloat),
                        tv = to_tensor(v, "v", kTakesFloat);
        const TensorRef tout = to_tensor(out, "out", kTakesF32);
        const TensorRef tlse = to_tensor(lse, "lse", kTakesF32);
        const TensorRef tdout = to_tensor(dout, "dout", kTakesFloat);
        if (tq.device != TensorRef::Device::CPU) {
          throw RuntimeError("flex_attention_cp_backward_cpu: q is " + tq.str() +
                             "; the CPU check of context parallelism takes CPU tensors of the "
                             "whole sequence");
        }
        AttentionOptions o;
        o.mods = mods;
        o.bindings = to_bindings(mods, buffers, params);
        o.scale = scale;
        CpuRunOptions cpu;
        cpu.num_threads = num_threads;
        CpuContextParallelGradients g;
        {
          nb::gil_scoped_release release;
          g = flex_attention_cp_backward_cpu(tq, tk, tv, tout, tlse, tdout, ranks, o, cpo, cpu);
        }
        auto shape_of = [](const TensorRef& t) {
          return std::vector<size_t>(t.shape.begin(), t.shape.end());
        };
        nb::list grads;
        for (auto& [name, values] : g.buffer_grads) {
          std::vector<size_t> shape{values.size()};
          for (const auto& [bound, t] : o.bindings.buffers)
            if (bound == name) shape = shape_of(t);
          grads.append(nb::make_tuple(name, f32_array(std::move(values), shape)));
        }
        return nb::make_tuple(f32_array(std::move(g.dq), shape_of(tq)),
                              f32_array(std::move(g.dk), shape_of(tk)),
                              f32_array(std::move(g.dv), shape_of(tv)), grads);
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dout"_a, "ranks"_a, "mods"_a, "buffers"_a, "params"_a,
      "scale"_a.none(), "strategy"_a, "layout"_a, "num_threads"_a = 0,
      "flex_attention_cp_backward_cpu: (dq, dk, dv, [(buffer name, gradient)]) of the whole "
      "sequence (f32, sequence order) from flex_attention_cp_cpu's out and lse, rank by rank.");

  // --- kernels (include/flexjit/kernel.h): emit, compile, inspect ---
  auto query_of = [](const std::string& family, const std::string& variant, const std::string& arch,
                     const std::string& dtype, int head_dim_qk, int head_dim_v, int gqa_ratio,
                     int block_size) {
    KernelQuery q;
    q.family = family;
    q.variant = variant;
    q.arch = arch;
    const std::optional<DType> dt = parse_dtype(dtype);
    if (!dt) throw UnsupportedError("dtype '" + dtype + "': use bf16, f16 or f32");
    q.dtype = *dt;
    q.head_dim_qk = head_dim_qk;
    q.head_dim_v = head_dim_v;
    q.gqa_ratio = gqa_ratio;
    q.block_size = block_size;
    return q;
  };
  auto source_dict = [](const KernelSource& s) {
    nb::dict d;
    d["description"] = s.description;
    d["selection"] = s.selection;
    d["kernel_name"] = s.kernel_name;
    d["source"] = s.source;
    d["source_key"] = s.source_key;
    d["dynamic_smem_bytes"] = s.dynamic_smem_bytes;
    return d;
  };
  m.def(
      "_emit_kernel",
      [query_of, source_dict](const Mods& mods, const std::string& family,
                              const std::string& variant, const std::string& arch,
                              const std::string& dtype, int dqk, int dv, int gqa, int block_size) {
        return source_dict(
            emit_kernel(mods, query_of(family, variant, arch, dtype, dqk, dv, gqa, block_size)));
      },
      "mods"_a, "family"_a, "variant"_a, "arch"_a, "dtype"_a, "head_dim_qk"_a, "head_dim_v"_a,
      "gqa_ratio"_a, "block_size"_a);
  m.def(
      "_compile_kernel",
      [query_of, source_dict](const Mods& mods, const std::string& family,
                              const std::string& variant, const std::string& arch,
                              const std::string& dtype, int dqk, int dv, int gqa, int block_size) {
        KernelBinary b;
        {
          nb::gil_scoped_release release;
          b = compile_kernel(mods,
                             query_of(family, variant, arch, dtype, dqk, dv, gqa, block_size));
        }
        nb::dict d = source_dict(b.source);
        d["cache"] = b.cache;
        d["cache_key"] = b.cache_key;
        d["compile_ms"] = b.compile_ms;
        d["cubin_bytes"] = b.cubin.size();
        d["registers"] = b.registers;
        d["spill_store_bytes"] = b.spill_store_bytes;
        d["spill_load_bytes"] = b.spill_load_bytes;
        d["stack_frame_bytes"] = b.stack_frame_bytes;
        d["static_shared_bytes"] = b.static_shared_bytes;
        d["wgmma_serialized"] = b.wgmma_serialized;
        return d;
      },
      "mods"_a, "family"_a, "variant"_a, "arch"_a, "dtype"_a, "head_dim_qk"_a, "head_dim_v"_a,
      "gqa_ratio"_a, "block_size"_a);
  m.def("_kernel_variants", [] {
    nb::list out;
    for (const KernelVariantInfo& v : kernel_variants()) {
      nb::dict d;
      d["family"] = v.family;
      d["name"] = v.name;
      d["summary"] = v.summary;
      d["auto_select"] = v.auto_select;
      d["priority"] = v.priority;
      d["templates"] = v.templates;
      d["entry_points"] = v.entry_points;
      out.append(d);
    }
    return out;
  });
  m.def("_kernel_families", [] {
    nb::list out;
    for (const KernelFamilyInfo& f : kernel_families()) {
      nb::list keys;
      for (const KernelConfigKey& k : f.config_keys) {
        nb::dict key;
        key["name"] = k.name;
        key["doc"] = k.doc;
        key["min"] = k.min;
        key["max"] = k.max;
        keys.append(key);
      }
      nb::dict d;
      d["name"] = f.name;
      d["summary"] = f.summary;
      d["kind"] = f.kind;
      d["math"] = f.math;
      d["config_keys"] = keys;
      out.append(d);
    }
    return out;
  });

  // The keys a forward (backward = False) or backward call's config dict takes: its families'
  // config keys, then its words (flexjit.torch maps kernel_options onto them).
  m.def("_call_config_keys",
        [](bool backward) { return backward ? backward_config_keys() : forward_config_keys(); });

  m.def("_cuda_device_name", [](int device) { return context_for(device).device_name(); });
  m.def("_cuda_arch", [](int device) { return context_for(device).arch(); });
  m.def("_cuda_synchronize", [](int device) {
    nb::gil_scoped_release release;
    context_for(device).synchronize();
  });
}
