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
implementation and an autograd formula (``torch.ops.flexjit.flex_attention_backward``), so the
forward and the backward run in eager mode, under ``torch.compile(fullgraph=True)`` (one graph;
the captured tensors are graph inputs) and in CUDA graphs. The flexjit extensions are
keyword-only: ``mask_mod=`` / ``sink_mod=`` (flexjit's mod forms too: a standard mod's name,
``.fx`` text, Mods), ``buffers=`` / ``params=`` for those forms, ``deterministic=``.
"""

import re
import types
import weakref
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

import flexjit
from flexjit import trace

__all__ = ["AuxOutput", "AuxRequest", "BlockMask", "and_masks", "create_block_mask",
           "flex_attention", "noop_mask", "or_masks"]

_FLOAT_DTYPES = ("f32", "f16", "bf16")
_QKV_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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


def _plan(specs: Tuple[Any, Any, Any]) -> _CallPlan:
    """The plan of (score_mod, mask_mod, sink_mod), cached by the functions' code: the same
    code with other captured values (another closure of the same factory) reuses it."""
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
                return plan
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
        if len(_plans) >= _MAX_PLANS:
            _plans.pop(next(iter(_plans)))
        _plans.setdefault(key, []).append((traced, plan))
    return plan


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
    if len(_int_buffers) >= _MAX_INT_BUFFERS:
        _int_buffers.pop(next(iter(_int_buffers)))
    _int_buffers[id(t)] = (weakref.ref(t), t._version, t32)
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
        mods = flexjit.parse_mods(text) if text else flexjit.Mods()
        _mods_by_text[text] = mods
    return mods


_native_masks: Dict[tuple, Any] = {}
_MAX_NATIVE = 64


def _native_block_mask(mask_tensors: List[Optional[Tensor]], sizes: List[int], mods_text: str):
    """flexjit's BlockMask over a torch BlockMask's tensors (borrowed, no copy), cached by the
    tensors' addresses and versions."""
    if not mask_tensors or mask_tensors[0] is None:
        return None
    key = (tuple((t.data_ptr(), t._version, tuple(t.shape)) if t is not None else None
                 for t in mask_tensors), tuple(sizes), mods_text)
    native = _native_masks.get(key)
    if native is None:
        ts = [t.contiguous() if t is not None and t.dtype == torch.int32 else
              (t.to(torch.int32).contiguous() if t is not None else None) for t in mask_tensors]
        native = flexjit._C._block_mask_from_arrays(*ts, sizes[0], sizes[1], sizes[2], sizes[3],
                                                    _mask_part(mods_text))
        if len(_native_masks) >= _MAX_NATIVE:
            _native_masks.pop(next(iter(_native_masks)))
        _native_masks[key] = native
    return native


_mask_parts: Dict[str, flexjit.Mods] = {}


def _mask_part(mods_text: str) -> flexjit.Mods:
    """The mask_mod alone of the ops' mods (a block mask's mods), made once per text."""
    part = _mask_parts.get(mods_text)
    if part is None:
        mods = _mods(mods_text)
        part = flexjit.Mods(mask_mod=mods.mask_mod) if mods.mask_mod is not None else \
            flexjit.Mods()
        _mask_parts[mods_text] = part
    return part


def _config(text: str, backward: bool) -> Dict[str, Any]:
    """The ``config=`` keyword of flexjit's call from the ops' config string
    ("k=v,...|k=v,...": the forward's, then the backward's)."""
    part = text.split("|")[1 if backward else 0] if text else ""
    if not part:
        return {}
    out: Dict[str, Any] = {}
    for item in part.split(","):
        k, v = item.split("=", 1)
        out[k] = v if k in ("variant", "autotune", "math", "dq_mode") else int(v)
    return {"config": out}


_auto_masks: Dict[tuple, Any] = {}


def _auto_block_mask(mods: flexjit.Mods, q: Tensor, k: Tensor, params: Dict[str, float]):
    """A GPU block mask for a mask_mod given without one (flexjit's mask_mod= keyword), cached
    unless the mask reads a buffer (then every tile is visited and the mask applied)."""
    if mods.mask_mod is None or not q.is_cuda:
        return None
    mask = flexjit.Mods(mask_mod=mods.mask_mod)
    if mask.buffers:
        return None
    names = {p.name for p in mask.params}
    mask_params = tuple(sorted((n, v) for n, v in params.items() if n in names))
    text = mask.to_text()
    batch = q.shape[0] if re.search(r"\bb\b", text) else 1  # broadcast unless it reads b / h
    heads = q.shape[1] if re.search(r"\bh\b", text) else 1
    key = (text, batch, heads, q.shape[2], k.shape[2], q.device.index, mask_params)
    bm = _auto_masks.get(key)
    if bm is None:
        bm = flexjit.create_block_mask(mask, batch, heads, q.shape[2], k.shape[2],
                                       device=q.device.index or 0, params=dict(mask_params))
        if len(_auto_masks) >= _MAX_NATIVE:  # decoding makes a new key per step
            _auto_masks.pop(next(iter(_auto_masks)))
        _auto_masks[key] = bm
    return bm


def _forward_impl(q, k, v, mods_text, buffer_names, buffers, param_names, param_values, scale,
                  return_lse, deterministic, mask_tensors, mask_sizes, config):
    """The forward (the op's body; eager calls run it without the op's dispatch)."""
    mods = _mods(mods_text)
    params = dict(zip(_names(param_names), param_values))
    block_mask = None
    if q.is_cuda:
        block_mask = _native_block_mask(mask_tensors, mask_sizes, mods_text) \
            if mask_tensors else _auto_block_mask(mods, q, k, params)
    return flexjit.flex_attention(q, k, v, mods, block_mask=block_mask,
                                  buffers=dict(zip(_names(buffer_names), buffers)),
                                  params=params, scale=scale, return_lse=True,
                                  **_config(config, backward=False))


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
    out = q.new_empty((b, hq, sq, v.shape[-1]),
                      dtype=q.dtype if q.device.type == "cuda" else torch.float32)
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
            if mask_tensors else _auto_block_mask(mods, q, k, params)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    if not q.is_cuda and dout.dtype != q.dtype:
        dout = dout.to(q.dtype)  # the CPU backward reads dout in q's dtype
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    dq, dk, dv, grads = flexjit.flex_attention_backward(
        q, k, v, out, lse, dout, mods, block_mask=block_mask,
        buffers=dict(zip(names, buffers)), params=params, scale=scale, dlse=dlse,
        deterministic=deterministic, **_config(config, backward=True))
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


class _EagerAttention(torch.autograd.Function):
    """Eager calls that need gradients: the op's forward and backward bodies under a plain
    autograd.Function, which costs a fraction of a custom op's dispatch (the op is for
    torch.compile, where the graph needs it)."""

    @staticmethod
    def forward(ctx, q, k, v, args, *buffers):
        (mods_text, buffer_names, param_names, param_values, scale, return_lse, deterministic,
         mask_tensors, mask_sizes, config) = args
        out, lse = _forward_impl(q, k, v, mods_text, buffer_names, list(buffers), param_names,
                                 param_values, scale, return_lse, deterministic, mask_tensors,
                                 mask_sizes, config)
        ctx.save_for_backward(q, k, v, out, lse, *buffers)
        ctx.args = args
        if not return_lse:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *buffers = ctx.saved_tensors
        (mods_text, buffer_names, param_names, param_values, scale, return_lse, deterministic,
         mask_tensors, mask_sizes, config) = ctx.args
        grads = _backward_impl(q, k, v, out, lse, dout, dlse if return_lse else None, mods_text,
                               buffer_names, buffers, param_names, param_values, scale,
                               deterministic, mask_tensors, mask_sizes, config)
        dq, dk, dv = grads[0].to(q.dtype), grads[1].to(k.dtype), grads[2].to(v.dtype)
        dbuffers = [g.to(b.dtype) if b.is_floating_point() and g.shape == b.shape else None
                    for b, g in zip(buffers, grads[3:])]
        return (dq, dk, dv, None, *dbuffers)


def _attention(q, k, v, *args):
    """The forward of a call: the custom op under torch.compile; in eager mode its body, under
    _EagerAttention when a gradient is needed."""
    if torch.compiler.is_compiling():
        return torch.ops.flexjit.flex_attention(q, k, v, *args)
    (mods_text, buffer_names, buffers, param_names, param_values, scale, return_lse,
     deterministic, mask_tensors, mask_sizes, config) = args
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or any(
            b.requires_grad for b in buffers)):
        return _EagerAttention.apply(
            q, k, v, (mods_text, buffer_names, param_names, param_values, scale, return_lse,
                      deterministic, mask_tensors, mask_sizes, config), *buffers)
    return _forward_impl(q, k, v, *args)


# --- kernel_options -------------------------------------------------------------------------

# torch's keys that set flexjit's config (forward / backward); fwd_ / bwd_ prefixed forms too.
_CONFIG_KEYS = {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "num_warps": "num_warps",
                "num_stages": "num_stages"}
# flexjit's own keys (docs/python.md).
_FLEXJIT_KEYS = {"variant": str, "autotune": str, "math": str, "num_splits": int,
                 "q_tiles": int, "persistent": int, "deterministic": bool, "dq_mode": str}
# torch's hints for its Triton kernels that have no meaning for flexjit's: accepted, ignored.
_IGNORED_KEYS = {"PRESCALE_QK", "ROWS_GUARANTEED_SAFE", "BLOCKS_ARE_CONTIGUOUS", "WRITE_DQ",
                 "FORCE_USE_FLEX_ATTENTION", "OUTPUT_LOGSUMEXP", "OUTPUT_MAX", "USE_TMA",
                 "BACKEND", "kpack", "matrix_instr_nonkdim", "waves_per_eu", "BLOCK_M1",
                 "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "SPARSE_Q_BLOCK_SIZE",
                 "SPARSE_KV_BLOCK_SIZE", "GQA_SHARED_HEADS", "SAFE_HEAD_DIM", "IS_DIVISIBLE"}


def _kernel_options(options: Optional[Mapping[str, Any]]) -> Tuple[str, str, bool]:
    """(forward config, backward config, deterministic) from torch's kernel_options."""
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
        elif key in _FLEXJIT_KEYS:
            fwd[key] = _FLEXJIT_KEYS[key](value)
            if key in ("autotune", "math"):  # the rest are the forward's alone
                bwd[key] = fwd[key]
        elif base in _IGNORED_KEYS:
            continue
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


def _check_tensor(name: str, t: Any) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dtype not in _QKV_DTYPES:
        raise ValueError(f"{name} has dtype {t.dtype}; flexjit takes torch.float32, "
                         f"torch.float16 and torch.bfloat16"
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
    if query.size(-2) != q_len or key.size(-2) != kv_len:
        smaller = query.size(-2) > q_len or key.size(-2) > kv_len
        raise ValueError(
            f"block_mask was created for block_mask.shape={block_mask.shape} but got "
            f"q_len={query.size(-2)} and kv_len={key.size(-2)}. "
            + ("Create a new block mask for these lengths." if smaller else
               "Create a new block mask with the correct length, or crop this one with "
               "block_mask._adjust(q_len, kv_len) (the upper left corner, which does not "
               "work for every mask_mod)."))
    if block_mask.kv_num_blocks.device != query.device:
        raise RuntimeError(f"q/k/v are on {query.device} but block_mask is on "
                           f"{block_mask.kv_num_blocks.device}")
    b = block_mask.kv_num_blocks.size(0)
    h = block_mask.kv_num_blocks.size(1)
    if b not in (1, query.size(0)) or h not in (1, query.size(1)):
        raise ValueError(f"block_mask has batch {b} and {h} heads; expected 1 or "
                         f"B={query.size(0)}, 1 or Hq={query.size(1)}")


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
    flexjit's variant, autotune, math, deterministic ...; torch's Triton-only hints are
    ignored; an unknown key is an error. Keyword-only flexjit extensions: ``mask_mod`` (a
    mask without a block mask: applied everywhere, or with one), ``sink_mod`` (attention
    sinks), ``buffers`` / ``params`` (for mods in flexjit's forms), ``deterministic``."""
    _check_tensor("query", query)
    _check_tensor("key", key)
    _check_tensor("value", value)
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
    names, tensors, pnames, pvalues = _bind(plan, specs, buffers, params)
    scale = float(scale) if scale is not None else None

    if qs[2] == 0:  # no queries: nothing to compute
        out = query.new_empty((qs[0], hq, 0, vs[3]))
        lse = query.new_empty((qs[0], hq, 0), dtype=torch.float32)
    else:
        out, lse = _attention(
            query, key, value, plan.text, ",".join(names), tensors, ",".join(pnames), pvalues,
            scale, want_lse, deterministic, mask_tensors, mask_sizes,
            f"{fwd_config}|{bwd_config}" if fwd_config or bwd_config else "")
        if out.dtype != query.dtype:  # the CPU backend computes in f32
            out = out.to(query.dtype)
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

