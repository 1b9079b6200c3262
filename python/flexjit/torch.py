"""flexjit as a drop-in for ``torch.nn.attention.flex_attention``: change the import, keep
the mods.

    from flexjit.torch import flex_attention, create_block_mask   # was torch.nn.attention...
    bias = torch.randn(2 * S, device="cuda", requires_grad=True)
    def rel_bias(score, b, h, q_idx, kv_idx):
        return score + bias[q_idx - kv_idx + S]
    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    block_mask = create_block_mask(causal, None, None, S, S)
    out = flex_attention(q, k, v, score_mod=rel_bias, block_mask=block_mask)
    out.sum().backward()                   # q.grad, k.grad, v.grad and bias.grad

``flex_attention``, ``create_block_mask``, ``BlockMask`` (torch's own class: a mask from either
library works with both), ``and_masks``, ``or_masks`` and ``noop_mask`` follow torch 2.11.
Mods are plain Python functions written against torch; flexjit traces them once into its mod
language (flexjit/trace.py): the tensors they capture become buffers (with gradients), the
numbers runtime params. Where flexjit differs from torch on purpose: docs/python.md,
"Migrating from torch.nn.attention.flex_attention".

Underneath, ``torch.ops.flexjit.flex_attention`` is a torch.library operator with a fake
implementation and an autograd formula (``torch.ops.flexjit.flex_attention_backward``). The
drop-in runs the op's bodies directly in eager mode and, under ``torch.compile(fullgraph=True)``
(one graph; the captured tensors are graph inputs), an autograd.Function that TorchDynamo
traces around a private forward op without an autograd kernel (docs/python.md, "Overhead");
CUDA graphs capture either. The flexjit extensions are
keyword-only: ``mask_mod=`` / ``sink_mod=`` (flexjit's mod forms too: a standard mod's name,
``.fx`` text, Mods), ``buffers=`` / ``params=`` for those forms, ``deterministic=``.
"""

import json
import re
import types
import weakref
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask
from torch.utils.dlpack import to_dlpack as _to_dlpack

import flexjit
from flexjit import trace

__all__ = ["AuxOutput", "AuxRequest", "BlockMask", "and_masks", "create_block_mask",
           "flex_attention", "noop_mask", "or_masks"]

_FLOAT_DTYPES = ("f32", "f16", "bf16")
_QKV_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# e4m3 query / key / value: flex_attention's inference forward (docs/python.md, "FP8").
_FP8 = getattr(torch, "float8_e4m3fn", None)


class AuxRequest(NamedTuple):
    """Which auxiliary outputs to return (torch's AuxRequest): ``lse``; ``max_scores`` is not
    computed by flexjit (an error)."""

    lse: bool = False
    max_scores: bool = False


class AuxOutput(NamedTuple):
    lse: Optional[Tensor] = None
    max_scores: Optional[Tensor] = None


# --- mask_mod combinators (torch's semantics) ----------------------------------------------


def noop_mask(b, h, q_idx, kv_idx):
    """Attends everywhere."""
    return b.new_ones((), dtype=torch.bool)


def and_masks(*mask_mods: Callable) -> Callable:
    """The intersection of mask_mods."""
    if not all(callable(m) for m in mask_mods):
        raise TypeError(f"and_masks takes mask_mod functions, got {mask_mods}")

    def and_mask(b, h, q_idx, kv_idx):
        result = b.new_ones((), dtype=torch.bool)
        for m in mask_mods:
            result = result & m(b, h, q_idx, kv_idx)
        return result

    return and_mask


def or_masks(*mask_mods: Callable) -> Callable:
    """The union of mask_mods."""
    if not all(callable(m) for m in mask_mods):
        raise TypeError(f"or_masks takes mask_mod functions, got {mask_mods}")

    def or_mask(b, h, q_idx, kv_idx):
        result = b.new_zeros((), dtype=torch.bool)
        for m in mask_mods:
            result = result | m(b, h, q_idx, kv_idx)
        return result

    return or_mask


def _is_noop(fn: Any) -> bool:
    if fn is None or fn is noop_mask:
        return True
    return getattr(fn, "__name__", "") == "noop_mask" and getattr(
        fn, "__module__", "") == "torch.nn.attention.flex_attention"


# --- plans: mods as text + where their buffers and params come from -----------------------


class _CallPlan(NamedTuple):
    text: str
    buffers: Tuple[Tuple[str, int, tuple, str], ...]  # (name, root, path, dsl dtype)
    params: Tuple[Tuple[str, int, tuple, str], ...]  # (name, root, path, type)
    specialized: Tuple[Tuple[int, tuple, Any], ...]  # (root, path, value) baked into the text


def _remember(cache: Dict[Any, Any], key: Any, value: Any, limit: int) -> Any:
    """cache[key] = value, first dropping the oldest entry when the cache holds `limit`: every
    cache of this module is bounded (a long-running process makes new keys: decoding, new
    shapes, new mods). Returns value."""
    if len(cache) >= limit and key not in cache:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value


_SIDES = ("score_mod", "mask_mod", "sink_mod")
_plans: Dict[tuple, List[Tuple[trace.Plan, _CallPlan]]] = {}
_MAX_PLANS = 256


_traceable_fns: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def _traceable(fn: Any) -> bool:
    """Whether fn is a function written against torch (traced), not flexjit's forms."""
    if not isinstance(fn, types.FunctionType):
        return False
    known = _traceable_fns.get(fn)
    if known is None:
        known = _traceable_fns[fn] = not trace.uses_dsl(fn)
    return known


# The last plans by the mod objects themselves: {ids: (specs, traced plan or None, plan, fns)}.
# An entry holds the objects, so their ids stay theirs while it lives; kept small, as a mod may
# capture large tensors.
_plans_by_object: Dict[Tuple[int, int, int], tuple] = {}
_MAX_PLANS_BY_OBJECT = 16


def _plan(specs: Tuple[Any, Any, Any]) -> _CallPlan:
    """The plan of (score_mod, mask_mod, sink_mod): the same objects as a recent call reuse its
    plan while its captures still match (trace.check); otherwise cached by the functions' code:
    the same code with other captured values (another closure of the same factory) reuses it."""
    ids = (id(specs[0]), id(specs[1]), id(specs[2]))
    hit = _plans_by_object.get(ids)
    if (hit is not None and hit[0][0] is specs[0] and hit[0][1] is specs[1]
            and hit[0][2] is specs[2] and (hit[1] is None or trace.check(hit[1], hit[3]))):
        return hit[2]
    plan, traced, fns = _plan_uncached(specs)
    # Not kept: a function written against flexjit.dsl (or another callable), whose captures
    # no check covers; names, text, Mods and dsl expressions are immutable.
    if all(f is not None or s is None or isinstance(s, _IMMUTABLE_SPECS)
           for s, f in zip(specs, fns)):
        _remember(_plans_by_object, ids, (specs, traced if any(fns) else None, plan, fns),
                  _MAX_PLANS_BY_OBJECT)
    return plan


_IMMUTABLE_SPECS = (str, flexjit.Mods, flexjit.dsl.Expr, flexjit.dsl.Param,
                    flexjit.dsl.BufferIndex)


def _plan_uncached(specs: Tuple[Any, Any, Any]):
    traceable = [_traceable(s) for s in specs]
    key: Optional[tuple] = tuple(s.__code__ if t else _spec_key(s)
                                 for s, t in zip(specs, traceable))
    if any(k is _UNCACHED for k in key):
        key = None  # a dsl expression or function: no stable key (ids are reused)
    entries = _plans.get(key) if key is not None else None
    fns = [s if t else None for s, t in zip(specs, traceable)]
    if entries is not None:
        for traced, plan in entries:
            if trace.check(traced, fns):
                return plan, traced, fns
    traced = trace.plan_for(fns, torch.device("cpu")) if any(fns) else None
    text = traced.text if traced is not None else ""
    native = [s if (s is not None and not t) else None for s, t in zip(specs, traceable)]
    if any(n is not None for n in native):
        mods = flexjit.make_mods(*native)
        if text:
            mods = flexjit.combine(flexjit.parse_mods(text), mods)
        text = "; ".join(ln for ln in mods.to_text().splitlines() if ln.strip())
    if traced is None:
        traced = trace.Plan(text, (), (), ())
    specialized = tuple((r, p, v) for r, p, kind, v in traced.checks if kind == "value")
    plan = _CallPlan(text, traced.buffers, traced.params, specialized)
    if key is not None:
        _remember(_plans, key, _plans.get(key, []) + [(traced, plan)], _MAX_PLANS)
    return plan, traced, fns


_UNCACHED = object()


def _spec_key(spec: Any) -> Any:
    """The plan-cache key of a mod in flexjit's forms: names, text and Mods by value; dsl
    expressions and dsl-written functions have none (an id() may be reused by a new object)."""
    if spec is None or isinstance(spec, (str, flexjit.Mods)):
        return spec
    return _UNCACHED


try:  # under torch.compile the plan is a constant of the graph (traced once, at compile time)
    _compiled_plan = torch._dynamo.assume_constant_result(_plan)
except AttributeError:  # pragma: no cover
    _compiled_plan = _plan


# int64 buffers are read as int32: the conversion (and, in eager mode, the check that the values
# fit) is kept per tensor version, so a document-id tensor used by every layer converts once.
# Keyed by id() with a weak reference to the tensor: a WeakKeyDictionary would compare tensors
# with == on a hash collision, which is elementwise for tensors.
_int_buffers: Dict[int, Tuple[Any, int, Tensor]] = {}
_MAX_INT_BUFFERS = 64


def _as_int32(name: str, t: Tensor) -> Tensor:
    if torch.compiler.is_compiling():
        return t.to(torch.int32)
    hit = _int_buffers.get(id(t))
    if hit is not None and hit[0]() is t and hit[1] == t._version:
        return hit[2]
    t32 = t.to(torch.int32)
    capturing = t.is_cuda and torch.cuda.is_current_stream_capturing()
    if t.dtype == torch.int64 and not capturing and t.numel() and not torch.equal(
            t32.to(torch.int64), t):
        raise ValueError(f"the mod captures '{name}', an int64 tensor with values outside int32 "
                         f"(min {int(t.min())}, max {int(t.max())}); flexjit indexes with int32")
    _remember(_int_buffers, id(t), (weakref.ref(t), t._version, t32), _MAX_INT_BUFFERS)
    return t32


def _bind(plan: _CallPlan, specs, extra_buffers, extra_params):
    """The buffer tensors and param values of a call: the traced captures read now, then the
    caller's own (for flexjit's mod forms)."""
    if torch.compiler.is_compiling():
        # Read so that TorchDynamo guards on them (eager calls: _plan's check did it).
        for root, path, value in plan.specialized:
            if trace.resolve(specs[root], path) != value:
                raise AssertionError("flexjit: a specialized value changed without a new plan")
    names, tensors = [], []
    for name, root, path, dtype in plan.buffers:
        t = trace.resolve(specs[root], path)
        if not isinstance(t, Tensor):
            raise TypeError(f"the mod's captured '{name}' is no longer a tensor")
        if t.dim() == 0:
            t = t.reshape(1)
        if dtype in ("i32",) and t.dtype != torch.int32:
            t = _as_int32(name, t)
        names.append(name)
        tensors.append(t)
    pnames, pvalues = [], []
    for name, root, path, _ in plan.params:
        pnames.append(name)
        pvalues.append(float(trace.resolve(specs[root], path)))
    for name, t in (extra_buffers or {}).items():
        names.append(name)
        tensors.append(t)
    for name, v in (extra_params or {}).items():
        pnames.append(name)
        pvalues.append(float(v))
    return names, tensors, pnames, pvalues


# --- the custom ops -------------------------------------------------------------------------


def _names(joined: str) -> List[str]:
    """Names cross the operators as one comma-separated string (a custom op's schema has no
    list of strings); they are identifiers, so no name holds a comma."""
    return joined.split(",") if joined else []


_mods_by_text: Dict[str, flexjit.Mods] = {}


def _mods(text: str) -> flexjit.Mods:
    mods = _mods_by_text.get(text)
    if mods is None:
        mods = _remember(_mods_by_text, text,
                         flexjit.parse_mods(text) if text else flexjit.Mods(), _MAX_PLANS)
    return mods


_native_masks: Dict[tuple, Any] = {}
# The same, by the tensor objects: {id(kv_num_blocks): (tensors, versions, sizes, mods text,
# mask)}. The entry holds the tensors, so their ids stay theirs while it lives; a hit is the
# same 8 objects at the same versions (~2 us, against ~8 us for the addresses' key).
_native_by_object: Dict[int, Tuple[list, tuple, list, str, Any]] = {}
_MAX_NATIVE = 64


def _native_block_mask(mask_tensors: List[Optional[Tensor]], sizes: List[int], mods_text: str):
    """flexjit's BlockMask over a torch BlockMask's tensors (borrowed, no copy), cached by the
    tensor objects and their versions (eager calls pass one BlockMask's tensors again and again),
    else by the tensors' addresses and versions (a compiled graph may pass other objects)."""
    if not mask_tensors or mask_tensors[0] is None:
        return None
    versions = tuple(t._version if t is not None else -1 for t in mask_tensors)
    hit = _native_by_object.get(id(mask_tensors[0]))
    if (hit is not None and hit[1] == versions and hit[3] == mods_text and hit[2] == sizes
            and all(a is b for a, b in zip(hit[0], mask_tensors))):
        return hit[4]
    key = (tuple((t.data_ptr(), tuple(t.shape)) if t is not None else None
                 for t in mask_tensors), versions, tuple(sizes), mods_text)
    native = _native_masks.get(key)
    if native is None:
        ts = [t.contiguous() if t is not None and t.dtype == torch.int32 else
              (t.to(torch.int32).contiguous() if t is not None else None) for t in mask_tensors]
        native = flexjit._C._block_mask_from_arrays(*ts, sizes[0], sizes[1], sizes[2], sizes[3],
                                                    _mask_part(mods_text))
        _remember(_native_masks, key, native, _MAX_NATIVE)
    _remember(_native_by_object, id(mask_tensors[0]),
              (list(mask_tensors), versions, list(sizes), mods_text, native), _MAX_NATIVE)
    return native


_mask_parts: Dict[str, flexjit.Mods] = {}


def _mask_part(mods_text: str) -> flexjit.Mods:
    """The mask_mod alone of the ops' mods (a block mask's mods), made once per text."""
    part = _mask_parts.get(mods_text)
    if part is None:
        mods = _mods(mods_text)
        part = flexjit.Mods(mask_mod=mods.mask_mod) if mods.mask_mod is not None else \
            flexjit.Mods()
        _remember(_mask_parts, mods_text, part, _MAX_PLANS)
    return part


_configs: Dict[Tuple[str, bool], Optional[Dict[str, Any]]] = {}


def _config(text: str, backward: bool) -> Optional[Dict[str, Any]]:
    """The ``config`` of flexjit's call from the ops' config string ("k=v,...|k=v,...": the
    forward's, then the backward's); None when empty. Parsed once per string."""
    key = (text, backward)
    if key in _configs:
        return _configs[key]
    part = text.split("|")[1 if backward else 0] if text else ""
    out: Optional[Dict[str, Any]] = None
    if part:
        out = {}
        for item in part.split(","):
            k, v = item.split("=", 1)
            out[k] = v if k in ("variant", "autotune", "math", "dq_mode") else int(v)
    _remember(_configs, key, out, _MAX_NATIVE)
    return out


class _AutoMask(NamedTuple):
    mask: flexjit.Mods  # the mask_mod alone
    reads_b: bool  # built per batch / head, else broadcast
    reads_h: bool
    params: Tuple[str, ...]  # the params it reads


_auto_mask_kinds: Dict[str, Optional[_AutoMask]] = {}
_auto_masks: Dict[tuple, Any] = {}


def _auto_mask_kind(mods_text: str) -> Optional[_AutoMask]:
    """What a block mask for the mods' mask_mod depends on, once per mods text; None when
    there is no mask_mod, or it reads a buffer (then every tile is visited and it applied)."""
    if mods_text in _auto_mask_kinds:
        return _auto_mask_kinds[mods_text]
    kind = None
    mask = _mask_part(mods_text)
    if mask.mask_mod is not None and not mask.buffers:
        text = mask.to_text()
        kind = _AutoMask(mask, bool(re.search(r"\bb\b", text)), bool(re.search(r"\bh\b", text)),
                         tuple(sorted(p.name for p in mask.params)))
    _remember(_auto_mask_kinds, mods_text, kind, _MAX_NATIVE)
    return kind


def _auto_block_mask(mods_text: str, q: Tensor, k: Tensor, params: Dict[str, float]):
    """A GPU block mask for a mask_mod given without one (flexjit's mask_mod= keyword), cached
    by the mask, the shape and the mask's params."""
    kind = _auto_mask_kind(mods_text)
    if kind is None or not q.is_cuda:
        return None
    qs = q.shape
    batch = qs[0] if kind.reads_b else 1  # broadcast unless it reads b / h
    heads = qs[1] if kind.reads_h else 1
    mask_params = tuple(params[n] for n in kind.params if n in params)
    key = (mods_text, batch, heads, qs[2], k.shape[2], q.get_device(), mask_params)
    bm = _auto_masks.get(key)
    if bm is None:
        bm = flexjit.create_block_mask(kind.mask, batch, heads, qs[2], k.shape[2],
                                       device=q.get_device(),
                                       params={n: params[n] for n in kind.params if n in params})
        _remember(_auto_masks, key, bm, _MAX_NATIVE)  # decoding makes a new key per step
    return bm


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_of(t: Tensor) -> int:
    if not t.is_cuda:
        return 0
    if _raw_stream is not None:
        return _raw_stream(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def _forward_impl(q, k, v, mods_text, buffer_names, buffers, param_names, param_values, scale,
                  return_lse, deterministic, mask_tensors, mask_sizes, config, descales=None):
    """The forward (the op's body; eager calls run it without the op's dispatch). It calls the
    binding directly (the public function validated the call) with few Python calls of its own:
    each costs more inside a compiled graph, and flexjit.flex_attention's generality (every
    framework, name checks) ~10 us a call (docs/python.md "Overhead"). descales: e4m3 inputs'
    [q, k, v] descale factors (None each for 1), or None."""
    mods = _mods_by_text.get(mods_text) or _mods(mods_text)
    names = buffer_names.split(",") if buffer_names else []
    params = list(zip(param_names.split(","), param_values)) if param_names else []
    cuda = q.is_cuda
    block_mask = None
    if cuda:
        block_mask = _native_block_mask(mask_tensors, mask_sizes, mods_text) \
            if mask_tensors else _auto_block_mask(mods_text, q, k, dict(params))
    qs = q.shape
    out = q.new_empty((qs[0], qs[1], qs[2], v.shape[3]), dtype=_out_dtype(q))
    lse = q.new_empty((qs[0], qs[1], qs[2]), dtype=torch.float32)
    cfg = _configs[(config, False)] if (config, False) in _configs else _config(config, False)
    qd = kd = vd = None
    if descales is not None:
        qd, kd, vd = (None if d is None else _to_dlpack(d) for d in descales)
    flexjit._C._flex_attention_into(
        _to_dlpack(q), _to_dlpack(k), _to_dlpack(v), _to_dlpack(out), _to_dlpack(lse), mods,
        block_mask, [(n, _to_dlpack(t)) for n, t in zip(names, buffers)], params, scale,
        _raw_stream(q.get_device()) if cuda and _raw_stream is not None else _stream_of(q), 0,
        None, None, False, config=cfg, q_descale=qd, k_descale=kd, v_descale=vd)
    return out, lse


def _out_dtype(q: Tensor) -> torch.dtype:
    """The dtype the kernels write out in: q's on a GPU (bf16 for e4m3 q), f32 on the CPU."""
    if q.device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if q.dtype == _FP8 else q.dtype


# The ops are defined with torch.library's low-level API (a schema, then Python kernels for the
# CPU and CUDA dispatch keys) rather than torch.library.custom_op, whose wrappers cost ~60 us per
# call on the build machine (scripts/py_overhead.py; docs/python.md "Overhead").
_LIB = torch.library.Library("flexjit", "DEF")  # noqa: TOR901 - kept alive by the module
_LIB.define("flex_attention(Tensor q, Tensor k, Tensor v, str mods_text, str buffer_names, "
            "Tensor[] buffers, str param_names, float[] param_values, float? scale, "
            "bool return_lse, bool deterministic, Tensor?[] mask_tensors, SymInt[] mask_sizes, "
            "str config) -> (Tensor, Tensor)")
_LIB.define("flex_attention_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            "Tensor dout, Tensor? dlse, str mods_text, str buffer_names, Tensor[] buffers, "
            "str param_names, float[] param_values, float? scale, bool deterministic, "
            "Tensor?[] mask_tensors, SymInt[] mask_sizes, str config) -> Tensor[]")


def _flex_attention_op(q: Tensor, k: Tensor, v: Tensor, mods_text: str,
                       buffer_names: str, buffers: List[Tensor], param_names: str,
                       param_values: List[float], scale: Optional[float],
                       return_lse: bool, deterministic: bool,
                       mask_tensors: List[Optional[Tensor]], mask_sizes: List[int],
                       config: str) -> Tuple[Tensor, Tensor]:
    """The forward. The lse is always computed (the backward needs it); return_lse says whether
    the caller sees it. mask_tensors: a BlockMask's 8 tensors (empty: none), mask_sizes its
    (Sq, Skv, Q block, KV block); config: "k=v,...|k=v,..." (forward | backward)."""
    return _forward_impl(q, k, v, mods_text, buffer_names, buffers, param_names, param_values,
                         scale, return_lse, deterministic, mask_tensors, mask_sizes, config)


for _key in ("CPU", "CUDA"):
    _LIB.impl("flex_attention", _flex_attention_op, _key)


@torch.library.register_fake("flexjit::flex_attention")
def _(q, k, v, mods_text, buffer_names, buffers, param_names, param_values, scale, return_lse,
      deterministic, mask_tensors, mask_sizes, config):
    b, hq, sq, _ = q.shape
    out = q.new_empty((b, hq, sq, v.shape[-1]), dtype=_out_dtype(q))
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    return out, lse


def _grad_buffers(mods: flexjit.Mods, buffer_names: List[str]) -> List[bool]:
    """Per given buffer: whether flexjit computes its gradient (a floating-point declaration)."""
    dtypes = {d.name: d.dtype for d in mods.buffers}
    return [dtypes.get(name) in _FLOAT_DTYPES for name in buffer_names]


def _backward_impl(q, k, v, out, lse, dout, dlse, mods_text, buffer_names, buffers, param_names,
                   param_values, scale, deterministic, mask_tensors, mask_sizes, config):
    """The backward (the backward op's body)."""
    mods = _mods(mods_text)
    names = _names(buffer_names)
    params = dict(zip(_names(param_names), param_values))
    block_mask = None
    if q.is_cuda:
        block_mask = _native_block_mask(mask_tensors, mask_sizes, mods_text) \
            if mask_tensors else _auto_block_mask(mods_text, q, k, params)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    if not q.is_cuda and dout.dtype != q.dtype:
        dout = dout.to(q.dtype)  # the CPU backward reads dout in q's dtype
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    dq, dk, dv, grads = flexjit.flex_attention_backward(
        q, k, v, out, lse, dout, mods, block_mask=block_mask,
        buffers=dict(zip(names, buffers)), params=params, scale=scale, dlse=dlse,
        deterministic=deterministic, config=_config(config, backward=True))
    result = [dq, dk, dv]
    for name, has_grad in zip(names, _grad_buffers(mods, names)):
        result.append(grads[name] if has_grad else q.new_empty((0,), dtype=torch.float32))
    return result


def _flex_attention_backward_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                dout: Tensor, dlse: Optional[Tensor], mods_text: str,
                                buffer_names: str, buffers: List[Tensor],
                                param_names: str, param_values: List[float],
                                scale: Optional[float], deterministic: bool,
                                mask_tensors: List[Optional[Tensor]], mask_sizes: List[int],
                                config: str) -> List[Tensor]:
    """[dq, dk, dv, one per buffer]: dq / dk / dv in q's dtype on a GPU (f32 on the CPU
    backend); an f32 gradient of each floating-point buffer's shape, an empty tensor for an
    integer buffer."""
    return _backward_impl(q, k, v, out, lse, dout, dlse, mods_text, buffer_names, buffers,
                          param_names, param_values, scale, deterministic, mask_tensors,
                          mask_sizes, config)


for _key in ("CPU", "CUDA"):
    _LIB.impl("flex_attention_backward", _flex_attention_backward_op, _key)


@torch.library.register_fake("flexjit::flex_attention_backward")
def _(q, k, v, out, lse, dout, dlse, mods_text, buffer_names, buffers, param_names, param_values,
      scale, deterministic, mask_tensors, mask_sizes, config):
    dtype = q.dtype if q.device.type == "cuda" else torch.float32
    result = [q.new_empty(q.shape, dtype=dtype), k.new_empty(k.shape, dtype=dtype),
              v.new_empty(v.shape, dtype=dtype)]
    for b, has_grad in zip(buffers, _grad_buffers(_mods(mods_text), _names(buffer_names))):
        result.append(q.new_empty(b.shape if has_grad else (0,), dtype=torch.float32))
    return result


def _setup_context(ctx, inputs, output):
    (q, k, v, mods_text, buffer_names, buffers, param_names, param_values, scale,
     return_lse, deterministic, mask_tensors, mask_sizes, config) = inputs
    out, lse = output
    present = [t for t in mask_tensors if t is not None]
    ctx.save_for_backward(q, k, v, out, lse, *buffers, *present)
    ctx.flexjit_args = (mods_text, buffer_names, len(buffers), param_names, list(param_values),
                        scale, return_lse, deterministic,
                        [t is not None for t in mask_tensors], list(mask_sizes), config)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, *rest = ctx.saved_tensors
    (mods_text, buffer_names, n_buffers, param_names, param_values, scale, return_lse,
     deterministic, mask_present, mask_sizes, config) = ctx.flexjit_args
    buffers, present = rest[:n_buffers], iter(rest[n_buffers:])
    mask_tensors = [next(present) if p else None for p in mask_present]
    dlse = grad_lse if return_lse else None  # unseen by the caller: its gradient is zero
    grads = torch.ops.flexjit.flex_attention_backward(
        q, k, v, out, lse, grad_out, dlse, mods_text, buffer_names, buffers, param_names,
        param_values, scale, deterministic, mask_tensors, mask_sizes, config)
    dq, dk, dv = grads[0].to(q.dtype), grads[1].to(k.dtype), grads[2].to(v.dtype)
    dbuffers = [g.to(b.dtype) if b.is_floating_point() and g.shape == b.shape else None
                for b, g in zip(buffers, grads[3:])]
    # One entry per input in the inputs' structure: torch treats a list of floats as one leaf
    # (None), but an empty list as a list ([]).
    return (dq, dk, dv, None, None, dbuffers, None, (None if param_values else []), None, None,
            None, [None] * len(mask_tensors), (None if mask_sizes else []), None)


torch.library.register_autograd("flexjit::flex_attention", _backward,
                                setup_context=_setup_context)


# The forward as called from a compiled graph: a private op without an autograd kernel (the
# autograd.Function below is traced into the graph instead), whose call's static part is one
# string (mods text, buffer and param names, scale, return_lse, deterministic, config; see
# _call_text). PyTorch's dispatcher converts 8 arguments into Python rather than 14 and runs one
# Python kernel rather than two: the public op's `register_autograd` kernel and its redispatch
# cost more than the rest of the call (docs/python.md, "Overhead").
_LIB.define("_flex_attention_fwd(Tensor q, Tensor k, Tensor v, str call, Tensor[] buffers, "
            "float[] param_values, Tensor?[] mask_tensors, SymInt[] mask_sizes, "
            "bool prepare_backward=False) -> (Tensor, Tensor)")

_calls: Dict[str, tuple] = {}
_MAX_CALLS = 256


@torch.compiler.assume_constant_result  # TorchDynamo runs it while tracing: a constant string
def _call_text(mods_text: str, buffer_names: str, param_names: str, scale: Optional[float],
               return_lse: bool, deterministic: bool, config: str) -> str:
    return json.dumps([mods_text, buffer_names, param_names, scale, return_lse, deterministic,
                       config])


def _call_parts(call: str) -> tuple:
    """_call_text's fields, parsed once per distinct text."""
    parts = _calls.get(call)
    if parts is None:
        parts = tuple(json.loads(call))
        _remember(_calls, call, parts, _MAX_CALLS)
    return parts


def _flex_attention_fwd_op(q: Tensor, k: Tensor, v: Tensor, call: str, buffers: List[Tensor],
                           param_values: List[float], mask_tensors: List[Optional[Tensor]],
                           mask_sizes: List[int],
                           prepare_backward: bool = False) -> Tuple[Tensor, Tensor]:
    """prepare_backward: a gradient is wanted (the graph's _Attention), so the backward's
    kernels start compiling first (_prepare_backward)."""
    mods_text, buffer_names, param_names, scale, return_lse, deterministic, config = \
        _calls[call] if call in _calls else _call_parts(call)
    if prepare_backward:
        _prepare_backward(q, k, v, mods_text, buffer_names, buffers, param_names, param_values,
                          scale, deterministic, mask_tensors, mask_sizes, config)
    return _forward_impl(q, k, v, mods_text, buffer_names, buffers, param_names, param_values,
                         scale, return_lse, deterministic, mask_tensors, mask_sizes, config)


for _key in ("CPU", "CUDA"):
    _LIB.impl("_flex_attention_fwd", _flex_attention_fwd_op, _key)


@torch.library.register_fake("flexjit::_flex_attention_fwd")
def _(q, k, v, call, buffers, param_values, mask_tensors, mask_sizes, prepare_backward=False):
    b, hq, sq, _ = q.shape
    out = q.new_empty((b, hq, sq, v.shape[-1]), dtype=_out_dtype(q))
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    return out, lse


# e4m3 query / key / value under torch.compile: the private forward op with the descale factors
# (None each: 1). FP8 has no backward, so no autograd.Function goes around it.
_LIB.define("_flex_attention_fp8(Tensor q, Tensor k, Tensor v, str call, Tensor[] buffers, "
            "float[] param_values, Tensor?[] mask_tensors, SymInt[] mask_sizes, "
            "Tensor?[] descales) -> (Tensor, Tensor)")


def _flex_attention_fp8_op(q: Tensor, k: Tensor, v: Tensor, call: str, buffers: List[Tensor],
                           param_values: List[float], mask_tensors: List[Optional[Tensor]],
                           mask_sizes: List[int],
                           descales: List[Optional[Tensor]]) -> Tuple[Tensor, Tensor]:
    mods_text, buffer_names, param_names, scale, return_lse, deterministic, config = \
        _calls[call] if call in _calls else _call_parts(call)
    return _forward_impl(q, k, v, mods_text, buffer_names, buffers, param_names, param_values,
                         scale, return_lse, deterministic, mask_tensors, mask_sizes, config,
                         descales)


for _key in ("CPU", "CUDA"):
    _LIB.impl("_flex_attention_fp8", _flex_attention_fp8_op, _key)


@torch.library.register_fake("flexjit::_flex_attention_fp8")
def _(q, k, v, call, buffers, param_values, mask_tensors, mask_sizes, descales):
    b, hq, sq, _ = q.shape
    out = q.new_empty((b, hq, sq, v.shape[-1]), dtype=_out_dtype(q))
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    return out, lse


# The backward calls whose kernels were queued already, by what shapes those kernels: a training
# loop's later steps skip the backward's planning. A key that misses a difference (strides, a
# buffer's dtype) only costs an early start; the backward plans its own call.
_prepared: Dict[Any, bool] = {}
_MAX_PREPARED = 256


def _prepare_backward(q, k, v, mods_text, buffer_names, buffers, param_names, param_values, scale,
                      deterministic, mask_tensors, mask_sizes, config) -> None:
    """The backward's early start (flex_attention_backward_prepare, docs/caching.md "First
    call"): before a forward whose gradient is wanted, the backward's kernels are queued to
    compile on a background thread while the forward and the rest of the model run. Once per
    distinct call; CPU tensors have no kernels to build."""
    if not q.is_cuda:
        return
    # Flat, without generators: ~2 us a call where the build machine's tuples of tuples took 8.
    key = (mods_text, buffer_names, config, deterministic, q.shape, k.shape, v.shape, q.dtype,
           q.device, *[b.shape for b in buffers], *mask_sizes,
           len(mask_tensors) > 2 and mask_tensors[2] is not None)
    if key in _prepared:
        return
    mods = _mods_by_text.get(mods_text) or _mods(mods_text)
    names = _names(buffer_names)
    params = list(zip(_names(param_names), param_values))
    block_mask = _native_block_mask(mask_tensors, mask_sizes, mods_text) \
        if mask_tensors else _auto_block_mask(mods_text, q, k, dict(params))
    try:
        flexjit._C._flex_attention_backward_prepare(
            _to_dlpack(q), _to_dlpack(k), _to_dlpack(v), mods, block_mask,
            [(n, _to_dlpack(t)) for n, t in zip(names, buffers)], params, scale, deterministic,
            config=_config(config, backward=True))
    except flexjit.Error:
        pass  # what the backward cannot build, it reports itself (if it is ever called)
    _remember(_prepared, key, True, _MAX_PREPARED)


class _Attention(torch.autograd.Function):
    """A call that needs gradients. Eager: the op's forward and backward bodies under a plain
    autograd.Function, which costs a fraction of a custom op's dispatch. Under torch.compile,
    TorchDynamo traces this Function: its forward becomes the private forward op in the graph
    and its backward the backward op, so the graph's ops need no autograd kernel."""

    @staticmethod
    def forward(ctx, q, k, v, args, *tensors):
        # tensors: the buffers, then the block mask's tensors (as many as mask_present says)
        (mods_text, buffer_names, param_names, param_values, scale, return_lse, deterministic,
         mask_sizes, config, n_buffers) = args
        buffers, mask_tensors = tensors[:n_buffers], tensors[n_buffers:]
        if torch.compiler.is_compiling():
            out, lse = torch.ops.flexjit._flex_attention_fwd(
                q, k, v, _call_text(mods_text, buffer_names, param_names, scale, return_lse,
                                    deterministic, config),
                list(buffers), param_values, list(mask_tensors), mask_sizes, True)
        else:
            _prepare_backward(q, k, v, mods_text, buffer_names, buffers, param_names,
                              param_values, scale, deterministic, mask_tensors, mask_sizes, config)
            out, lse = _forward_impl(q, k, v, mods_text, buffer_names, list(buffers),
                                     param_names, param_values, scale, return_lse,
                                     deterministic, list(mask_tensors), mask_sizes, config)
        present = [t for t in mask_tensors if t is not None]
        ctx.save_for_backward(q, k, v, out, lse, *buffers, *present)
        ctx.args = args
        ctx.mask_present = [t is not None for t in mask_tensors]
        if not return_lse:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *rest = ctx.saved_tensors
        (mods_text, buffer_names, param_names, param_values, scale, return_lse, deterministic,
         mask_sizes, config, n_buffers) = ctx.args
        buffers, present = rest[:n_buffers], iter(rest[n_buffers:])
        mask_tensors = [next(present) if p else None for p in ctx.mask_present]
        dlse = dlse if return_lse else None  # unseen by the caller: its gradient is zero
        if torch.compiler.is_compiling():
            grads = torch.ops.flexjit.flex_attention_backward(
                q, k, v, out, lse, dout, dlse, mods_text, buffer_names, list(buffers),
                param_names, param_values, scale, deterministic, mask_tensors, mask_sizes,
                config)
        else:
            grads = _backward_impl(q, k, v, out, lse, dout, dlse, mods_text, buffer_names,
                                   buffers, param_names, param_values, scale, deterministic,
                                   mask_tensors, mask_sizes, config)
        dq, dk, dv = grads[0].to(q.dtype), grads[1].to(k.dtype), grads[2].to(v.dtype)
        dbuffers = [g.to(b.dtype) if b.is_floating_point() and g.shape == b.shape else None
                    for b, g in zip(buffers, grads[3:])]
        return (dq, dk, dv, None, *dbuffers, *([None] * len(mask_tensors)))


def _distinct(*tensors: Tensor) -> List[Tensor]:
    """The tensors, each repeat of one replaced by a view of it. TorchDynamo (torch 2.11) keeps
    only the last gradient of a tensor given to a traced autograd.Function more than once
    (flex_attention(q, q, q) under torch.compile got dv alone as q.grad); views are distinct
    inputs whose gradients autograd sums into the tensor."""
    seen: List[Tensor] = []
    result = []
    for t in tensors:
        if any(t is s for s in seen):
            t = t.view_as(t)
        else:
            seen.append(t)
        result.append(t)
    return result


def _attention(q, k, v, *args, descales=None):
    """The forward of a call: _Attention when a gradient is needed (eager or compiled), else the
    op's body (eager) or the private forward op (compiled). descales (e4m3 inputs: [q, k, v]
    factors, None each for 1; flex_attention checked that no gradient is wanted): the forward
    alone, in eager mode or through the private FP8 op."""
    (mods_text, buffer_names, buffers, param_names, param_values, scale, return_lse,
     deterministic, mask_tensors, mask_sizes, config) = args
    if descales is not None:
        if torch.compiler.is_compiling():
            return torch.ops.flexjit._flex_attention_fp8(
                q, k, v, _call_text(mods_text, buffer_names, param_names, scale, return_lse,
                                    deterministic, config),
                buffers, param_values, mask_tensors, mask_sizes, descales)
        return _forward_impl(q, k, v, *args, descales)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or any(
            b.requires_grad for b in buffers)):
        if torch.compiler.is_compiling():
            q, k, v, *buffers = _distinct(q, k, v, *buffers)
        return _Attention.apply(
            q, k, v, (mods_text, buffer_names, param_names, param_values, scale, return_lse,
                      deterministic, mask_sizes, config, len(buffers)), *buffers, *mask_tensors)
    if torch.compiler.is_compiling():
        return torch.ops.flexjit._flex_attention_fwd(
            q, k, v, _call_text(mods_text, buffer_names, param_names, scale, return_lse,
                                deterministic, config),
            buffers, param_values, mask_tensors, mask_sizes)
    return _forward_impl(q, k, v, *args)


# --- kernel_options -------------------------------------------------------------------------

# torch's keys that set flexjit's config (forward / backward); fwd_ / bwd_ prefixed forms too.
_CONFIG_KEYS = {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "num_warps": "num_warps",
                "num_stages": "num_stages"}
# flexjit's own keys (docs/python.md): the calls' words, then (ints, the forward's) the config
# keys of the families a forward call plans that torch's keys above do not set: num_splits,
# q_tiles, persistent today, read from the family records (flexjit.kernel_families()), so a new
# family's key needs no edit here.
_FLEXJIT_KEYS = {"variant": str, "autotune": str, "math": str, "deterministic": bool,
                 "dq_mode": str, "check_buffers": bool}
_FLEXJIT_KEYS.update({k: int for k in flexjit._C._call_config_keys(False)
                      if k not in _FLEXJIT_KEYS and k not in _CONFIG_KEYS.values()})
# torch's hints for its Triton kernels that have no meaning for flexjit's: accepted, ignored.
_IGNORED_KEYS = {"PRESCALE_QK", "ROWS_GUARANTEED_SAFE", "BLOCKS_ARE_CONTIGUOUS", "WRITE_DQ",
                 "FORCE_USE_FLEX_ATTENTION", "OUTPUT_LOGSUMEXP", "OUTPUT_MAX", "USE_TMA",
                 "BACKEND", "kpack", "matrix_instr_nonkdim", "waves_per_eu", "BLOCK_M1",
                 "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "SPARSE_Q_BLOCK_SIZE",
                 "SPARSE_KV_BLOCK_SIZE", "GQA_SHARED_HEADS", "SAFE_HEAD_DIM", "IS_DIVISIBLE"}


# e4m3 inputs' descale factors (flex_attention; read by _descales, not by _kernel_options).
_DESCALE_KEYS = ("q_descale", "k_descale", "v_descale")


def _descales(options: Optional[Mapping[str, Any]], query: Tensor):
    """(kernel_options without the descale keys, [q, k, v] descale factors or None when no key
    is given). A factor is a tensor (the call checks float32 [1] or one per head on query's
    device) or a number (a float32 [1] tensor on query's device); None or absent: 1."""
    if not options or not any(key in options for key in _DESCALE_KEYS):
        return options, None
    factors: List[Optional[Tensor]] = []
    for key in _DESCALE_KEYS:
        x = options.get(key)
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            x = torch.tensor([float(x)], dtype=torch.float32, device=query.device)
        elif x is not None and not isinstance(x, Tensor):
            raise TypeError(f"kernel_options[{key!r}] must be a torch.Tensor (float32 [1], or "
                            f"one factor per head) or a number, not {type(x).__name__}")
        factors.append(x)
    return {k: v for k, v in options.items() if k not in _DESCALE_KEYS}, factors


def _kernel_options(options: Optional[Mapping[str, Any]]) -> Tuple[str, str, bool]:
    """(forward config, backward config, deterministic) from torch's kernel_options (less the
    descale keys, which flex_attention takes out first: _descales)."""
    if not options:
        return "", "", False
    fwd: Dict[str, Any] = {}
    bwd: Dict[str, Any] = {}
    deterministic = False
    for key, value in options.items():
        base = key[4:] if key.startswith(("fwd_", "bwd_")) else key
        if base in _CONFIG_KEYS:
            targets = [fwd] if key.startswith("fwd_") else [bwd] if key.startswith("bwd_") \
                else [fwd, bwd]
            for t in targets:
                t[_CONFIG_KEYS[base]] = int(value)
        elif key == "deterministic":
            deterministic = bool(value)
        elif key == "dq_mode":
            bwd[key] = str(value)
        elif key == "check_buffers":  # both calls; 0 / 1 in the config text
            if bool(value):
                fwd[key] = bwd[key] = 1
        elif key in _FLEXJIT_KEYS:
            fwd[key] = _FLEXJIT_KEYS[key](value)
            if key in ("autotune", "math"):  # the rest are the forward's alone
                bwd[key] = fwd[key]
        elif base in _IGNORED_KEYS:
            continue
        elif key in _DESCALE_KEYS:
            raise ValueError(f"kernel_options: {key!r} (a descale factor of float8_e4m3fn "
                             f"inputs) is read by flexjit.torch.flex_attention only")
        else:
            known = sorted(set(_CONFIG_KEYS) | set(_FLEXJIT_KEYS))
            known.append("fwd_ / bwd_ forms of " + ", ".join(_CONFIG_KEYS))
            raise ValueError(f"kernel_options: unknown key {key!r}; flexjit reads "
                             f"{', '.join(known)} and ignores torch's Triton hints "
                             f"({', '.join(sorted(_IGNORED_KEYS))})")

    def text(d):
        return ",".join(f"{k}={v}" for k, v in sorted(d.items()))

    return text(fwd), text(bwd), deterministic


# --- the public functions -------------------------------------------------------------------


def _check_tensor(name: str, t: Any, fp8: bool = False) -> None:
    """fp8: also take float8_e4m3fn (flex_attention's forward)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dtype not in _QKV_DTYPES and not (fp8 and _FP8 is not None and t.dtype == _FP8):
        raise ValueError(f"{name} has dtype {t.dtype}; flexjit takes torch.float32, "
                         f"torch.float16 and torch.bfloat16"
                         + (" (and torch.float8_e4m3fn for an inference forward)" if fp8 else "")
                         + (" (convert with .float())" if t.dtype == torch.float64 else ""))
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D [B, H, S, D]; it has shape {list(t.shape)}")


def _mask_tensors(block_mask: BlockMask) -> Tuple[List[Optional[Tensor]], List[int]]:
    ts = [block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
          block_mask.full_kv_indices, block_mask.q_num_blocks, block_mask.q_indices,
          block_mask.full_q_num_blocks, block_mask.full_q_indices]
    sizes = [int(block_mask.seq_lengths[0]), int(block_mask.seq_lengths[1]),
             int(block_mask.BLOCK_SIZE[0]), int(block_mask.BLOCK_SIZE[1])]
    return ts, sizes


def _check_block_mask(block_mask: Any, query: Tensor, key: Tensor) -> None:
    if not isinstance(block_mask, BlockMask):
        raise TypeError(
            f"block_mask must be a BlockMask (from create_block_mask), not "
            f"{type(block_mask).__name__}; a mask function goes to create_block_mask (or to "
            f"flexjit's keyword mask_mod=)")
    if block_mask.kv_indices.dim() != 4:
        raise ValueError(f"block_mask has kv_indices of shape {list(block_mask.kv_indices.shape)};"
                         f" flex_attention takes a [B, H, ...] mask (an indexed mask "
                         f"block_mask[b] is for inspection)")
    q_len, kv_len = block_mask.seq_lengths
    qs, ks = query.shape, key.shape
    if qs[2] != q_len or ks[2] != kv_len:
        smaller = qs[2] > q_len or ks[2] > kv_len
        raise ValueError(
            f"block_mask was created for block_mask.shape={block_mask.shape} but got "
            f"q_len={qs[2]} and kv_len={ks[2]}. "
            + ("Create a new block mask for these lengths." if smaller else
               "Create a new block mask with the correct length, or crop this one with "
               "block_mask._adjust(q_len, kv_len) (the upper left corner, which does not "
               "work for every mask_mod)."))
    if block_mask.kv_num_blocks.device != query.device:
        raise RuntimeError(f"q/k/v are on {query.device} but block_mask is on "
                           f"{block_mask.kv_num_blocks.device}")
    b, h = block_mask.kv_num_blocks.shape[:2]
    if b not in (1, qs[0]) or h not in (1, qs[1]):
        raise ValueError(f"block_mask has batch {b} and {h} heads; expected 1 or "
                         f"B={qs[0]}, 1 or Hq={qs[1]}")


def _check_no_grad(query, key, value, names, tensors, descales) -> None:
    """e4m3 inputs run the forward only: UnsupportedError naming the first tensor that wants a
    gradient."""
    named = [("query", query), ("key", key), ("value", value)]
    named += [(f"buffer {n!r}", t) for n, t in zip(names, tensors)]
    named += [(f"kernel_options[{k!r}]", t) for k, t in zip(_DESCALE_KEYS, descales or ())]
    for name, t in named:
        if t is not None and t.requires_grad:
            raise flexjit.UnsupportedError(
                f"{name} requires grad, but float8_e4m3fn inputs run the forward only (flexjit "
                f"has no FP8 backward): call under torch.no_grad() or torch.inference_mode(), "
                f"or detach() it")


def flex_attention(query: Tensor, key: Tensor, value: Tensor, score_mod: Any = None,
                   block_mask: Optional[BlockMask] = None, scale: Optional[float] = None,
                   enable_gqa: bool = False, return_lse: bool = False,
                   kernel_options: Optional[Mapping[str, Any]] = None, *,
                   return_aux: Optional[AuxRequest] = None, mask_mod: Any = None,
                   sink_mod: Any = None, buffers: Optional[Mapping[str, Tensor]] = None,
                   params: Optional[Mapping[str, float]] = None, deterministic: bool = False):
    """``torch.nn.attention.flex_attention.flex_attention`` on flexjit's kernels.

    query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] (Hq = Hkv unless
    ``enable_gqa``); ``score_mod(score, b, h, q_idx, kv_idx)`` a torch function (traced:
    captured tensors become buffers, with gradients; numbers runtime params); ``block_mask``
    a BlockMask (torch's or flexjit's create_block_mask), whose ``mask_mod`` applies in its
    partial blocks. Returns out [B, Hq, L, Ev]; with ``return_lse`` (out, lse [B, Hq, L] f32,
    natural log); with ``return_aux=AuxRequest(lse=True)`` (out, AuxOutput(lse=...)).
    ``kernel_options``: BLOCK_M, BLOCK_N, num_warps, num_stages (and fwd_ / bwd_ forms),
    flexjit's variant, autotune, math, deterministic, check_buffers ...; torch's Triton-only
    hints are ignored; an unknown key is an error. Keyword-only flexjit extensions: ``mask_mod`` (a
    mask without a block mask: applied everywhere, or with one), ``sink_mod`` (attention
    sinks), ``buffers`` / ``params`` (for mods in flexjit's forms), ``deterministic``.

    FP8: float8_e4m3fn query, key and value run the forward (sm_90a; the CPU backend) with
    descale factors in ``kernel_options`` (``q_descale``, ``k_descale``, ``v_descale``: float32
    tensors of shape [1] or one per head, or numbers; absent: 1); out is bfloat16. There is no
    FP8 backward: a tensor that requires grad is an UnsupportedError outside torch.no_grad()."""
    _check_tensor("query", query, fp8=True)
    _check_tensor("key", key, fp8=True)
    _check_tensor("value", value, fp8=True)
    if not (query.device == key.device == value.device):
        raise RuntimeError(f"query, key and value must be on one device; got {query.device}, "
                           f"{key.device}, {value.device}")
    qs, ks, vs = query.shape, key.shape, value.shape
    if qs[3] != ks[3]:
        raise ValueError(f"query and key must have the same head dim; got {qs[3]} and {ks[3]}")
    if ks[1] != vs[1] or ks[2] != vs[2]:
        raise ValueError(f"key {list(ks)} and value {list(vs)} must agree on heads and length")
    hq, hkv = qs[1], ks[1]
    if not enable_gqa and hq != hkv:
        raise ValueError(f"Expect query and key/value to have the same number of heads but got "
                         f"Hq={hq} and Hkv={hkv}. Try setting enable_gqa=True for GQA.")
    if enable_gqa and hq % hkv != 0:
        raise ValueError(f"Expect number of query heads to be a multiple of kv heads for GQA but "
                         f"got Hq={hq} and Hkv={hkv}.")
    if qs[0] != ks[0] or ks[0] != vs[0]:
        raise ValueError(f"query has batch {qs[0]} and key/value {ks[0]}/{vs[0]}; flexjit takes "
                         f"one batch for all three (expand key and value)")
    if return_lse and return_aux is not None:
        raise ValueError("Cannot specify both return_lse and return_aux; use "
                         "return_aux=AuxRequest(lse=True)")
    if return_aux is not None and getattr(return_aux, "max_scores", False):
        raise flexjit.UnsupportedError("return_aux: max_scores is not computed by flexjit "
                                       "(lse is)")
    want_lse = return_lse or (return_aux is not None and bool(getattr(return_aux, "lse", False)))
    kernel_options, descales = _descales(kernel_options, query)
    fwd_config, bwd_config, det = _kernel_options(kernel_options)
    deterministic = deterministic or det

    mask_fn = None
    mask_tensors: List[Optional[Tensor]] = []
    mask_sizes: List[int] = []
    if block_mask is not None:
        _check_block_mask(block_mask, query, key)
        mask_fn = getattr(block_mask, "mask_mod", None)
        if getattr(mask_fn, "__name__", "") == "_sliced_mask_mod_error":
            raise RuntimeError("Cannot use mask_mod from a sliced BlockMask")
        if _is_noop(mask_fn):
            mask_fn = None
        if query.is_cuda:
            mask_tensors, mask_sizes = _mask_tensors(block_mask)
    if mask_mod is not None:
        if mask_fn is not None:
            raise ValueError("mask_mod= and a block_mask with a mask_mod of its own: give one")
        mask_fn = mask_mod
    specs = (score_mod, mask_fn, sink_mod)
    plan = _compiled_plan(specs) if torch.compiler.is_compiling() else _plan(specs)
    if (buffers or params) and not torch.compiler.is_compiling():
        # Values for flexjit's mod forms: a misspelt name is an error (the GPU path says so,
        # the CPU backend would ignore it). Traced captures are declared by construction.
        flexjit._check_names(_mods(plan.text), None, buffers, params)
    names, tensors, pnames, pvalues = _bind(plan, specs, buffers, params)
    scale = float(scale) if scale is not None else None
    # e4m3 inputs: the forward alone, out in bf16 (the descales of other dtypes are an error of
    # the call).
    fp8 = _FP8 is not None and _FP8 in (query.dtype, key.dtype, value.dtype)
    if fp8 and torch.is_grad_enabled():
        _check_no_grad(query, key, value, names, tensors, descales)
    if fp8 and descales is None:
        descales = [None, None, None]
    out_dtype = torch.bfloat16 if fp8 else query.dtype

    if qs[2] == 0:  # no queries: nothing to compute
        out = query.new_empty((qs[0], hq, 0, vs[3]), dtype=out_dtype)
        lse = query.new_empty((qs[0], hq, 0), dtype=torch.float32)
    else:
        out, lse = _attention(
            query, key, value, plan.text, ",".join(names), tensors, ",".join(pnames), pvalues,
            scale, want_lse, deterministic, mask_tensors, mask_sizes,
            f"{fwd_config}|{bwd_config}" if fwd_config or bwd_config else "",
            descales=descales)
        if out.dtype != out_dtype:  # the CPU backend computes in f32
            out = out.to(out_dtype)
    if return_aux is not None:
        return out, AuxOutput(lse=lse if want_lse else None)
    return (out, lse) if return_lse else out


def create_block_mask(mask_mod: Callable, B: Optional[int], H: Optional[int], Q_LEN: int,
                      KV_LEN: int, device: Any = "cuda", BLOCK_SIZE: Any = 128,
                      _compile: bool = False) -> BlockMask:
    """``torch.nn.attention.flex_attention.create_block_mask`` built by flexjit: the mask_mod
    (a torch function, traced) is evaluated per block on the device (one JIT kernel on a
    GPU; interval analysis and the interpreter on the CPU). B / H of None broadcast (1).
    Returns torch's BlockMask, whose tensors are views of flexjit's arrays; ``_compile`` is
    accepted for compatibility (flexjit always compiles)."""
    if isinstance(BLOCK_SIZE, (tuple, list)):
        if len(BLOCK_SIZE) != 2 or BLOCK_SIZE[0] != BLOCK_SIZE[1]:
            raise flexjit.UnsupportedError(
                f"BLOCK_SIZE={tuple(BLOCK_SIZE)}: flexjit builds square sparse blocks (one size "
                f"for Q and KV)")
        block = int(BLOCK_SIZE[0])
    else:
        block = int(BLOCK_SIZE)
    b = 1 if B is None else int(B)
    h = 1 if H is None else int(H)
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if _is_noop(mask_mod):
        mask_spec: Any = "mask_mod = true"
        specs: Tuple[Any, Any, Any] = (None, mask_spec, None)
    else:
        specs = (None, mask_mod, None)
    plan = _plan(specs)
    names, tensors, pnames, pvalues = _bind(plan, specs, None, None)
    mods = _mods(plan.text)
    native = flexjit.create_block_mask(
        mods, b, h, Q_LEN, KV_LEN, device="cpu" if dev.type == "cpu" else dev.index,
        BLOCK_SIZE=block, buffers=dict(zip(names, tensors)), params=dict(zip(pnames, pvalues)))
    views = native.views()
    convert = torch.from_dlpack if dev.type == "cuda" else torch.from_numpy
    ts = {k: (convert(a) if a is not None else None) for k, a in views.items()}
    return BlockMask(seq_lengths=(Q_LEN, KV_LEN), kv_num_blocks=ts["kv_num_blocks"],
                     kv_indices=ts["kv_indices"], full_kv_num_blocks=ts["full_kv_num_blocks"],
                     full_kv_indices=ts["full_kv_indices"], q_num_blocks=ts["q_num_blocks"],
                     q_indices=ts["q_indices"], full_q_num_blocks=ts["full_q_num_blocks"],
                     full_q_indices=ts["full_q_indices"], BLOCK_SIZE=(block, block),
                     mask_mod=mask_mod if mask_mod is not None else noop_mask)

