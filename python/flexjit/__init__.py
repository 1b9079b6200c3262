"""flexjit: JIT-compiled FlexAttention kernels from Python.

    import numpy as np, flexjit
    q = k = v = np.random.randn(1, 8, 256, 64).astype(np.float32)
    out = flexjit.flex_attention(q, k, v, score_mod="softcap", mask_mod="causal")

Inputs are any DLPack arrays (NumPy, PyTorch, CuPy, ...), viewed without a copy; CPU arrays
run on the CPU backend (LLVM JIT, f32 output), CUDA arrays on the GPU (output dtype of q).
Results come back in the framework of ``q``. See docs/python.md.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, Callable, Mapping, Optional, Tuple, Union

from . import dsl
from ._flexjit import (  # noqa: F401
    BlockMask,
    CacheError,
    CompileError,
    Error,
    InternalError,
    JitError,
    Mods,
    RuntimeError,
    UnsupportedError,
    __version__,
    combine,
    load_mods_file,
    parse_mods,
    standard_mod_names,
    standard_mod_source,
)
from . import _flexjit as _C

ModSpec = Union[None, str, "dsl.Expr", Mods, Callable[..., Any]]

# flexjit.RuntimeError is left out: `from flexjit import *` must not replace Python's builtin
# RuntimeError (use flexjit.RuntimeError, or catch flexjit.Error).
__all__ = [
    "BlockMask", "CacheError", "CompileError", "Error", "InternalError", "JitError", "Mods",
    "UnsupportedError", "combine", "create_block_mask", "dsl", "emit",
    "flex_attention", "flex_attention_backward", "inspect", "kernel_families", "kernel_variants",
    "load_mods_file", "make_mods", "parse_mods", "standard_mod_names", "standard_mod_source", "standard_mods",
]


def standard_mods(name: str) -> Mods:
    """A standard mod set by name (``flexjit.standard_mod_names()`` lists them)."""
    return _C.standard_mods(name)


# Mods of names and text, parsed once: a call with mask_mod="causal" costs a dict lookup.
_text_mods: dict = {}

_ASSIGNMENT = re.compile(r"^\s*(score_mod|mask_mod|sink_mod)\s*=(?!=)", re.MULTILINE)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LEAF_NAMES = {"score", "b", "h", "q_idx", "kv_idx", "true", "false"}


def _mods_of(spec: ModSpec, kind: str) -> Optional[Mods]:
    """One side (kind 'score_mod', 'mask_mod' or 'sink_mod') of a mod specification as Mods."""
    if spec is None:
        return None
    if isinstance(spec, Mods):
        return spec
    if isinstance(spec, str):
        cached = _text_mods.get((spec, kind))
        if cached is not None:
            return cached
        if os.path.isfile(spec):  # a file may change: read on every call
            mods = _C.load_mods_file(spec)
            if getattr(mods, kind) is None:
                raise CompileError(f"{kind}={spec!r} has no {kind}")
            return mods
        if spec in _C.standard_mod_names():
            mods = _C.standard_mods(spec)
        elif _ASSIGNMENT.search(spec):
            mods = _C.parse_mods(spec)
        elif _IDENTIFIER.fullmatch(spec) and spec not in _LEAF_NAMES:
            # One word that names nothing: a mistyped standard mod ("causl").
            names = _C.standard_mod_names()
            close = difflib.get_close_matches(spec, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CompileError(f"{kind}={spec!r} is not a standard mod{hint}, an existing file "
                               f"or .fx text; the standard mods are: {', '.join(names)}")
        else:  # a bare expression: "score * 2", "q_idx >= kv_idx"
            mods = _C.parse_mods(f"{kind} = {spec}")
            mods.name = spec
        if getattr(mods, kind) is None and mods.sink_mod is None:
            defines = [k for k in ("score_mod", "mask_mod", "sink_mod")
                       if getattr(mods, k) is not None]
            raise CompileError(f"{kind}={spec!r} has no {kind} (it defines {', '.join(defines)})")
        if len(_text_mods) >= 1024:
            _text_mods.clear()
        _text_mods[(spec, kind)] = mods
        return mods
    if isinstance(spec, (dsl.Expr, dsl.Param, dsl.BufferIndex)):
        expr = dsl.as_expr(spec)
    elif callable(spec):
        if kind == "score_mod":
            expr = dsl.as_expr(spec(dsl.score(), dsl.b_idx(), dsl.h_idx(), dsl.q_idx(), dsl.kv_idx()))
        elif kind == "sink_mod":
            expr = dsl.as_expr(spec(dsl.b_idx(), dsl.h_idx(), dsl.q_idx()))
        else:
            expr = dsl.as_expr(spec(dsl.b_idx(), dsl.h_idx(), dsl.q_idx(), dsl.kv_idx()))
    else:
        raise TypeError(f"{kind} must be a standard mod's name, .fx text, a dsl expression, a "
                        f"function of dsl expressions or Mods, not {type(spec).__name__}")
    return Mods(**{kind: expr}, name=getattr(spec, "__name__", "<python>"))


def make_mods(score_mod: ModSpec = None, mask_mod: ModSpec = None,
              sink_mod: ModSpec = None) -> Mods:
    """Mods from a score_mod, a mask_mod and a sink_mod, each a standard mod's name
    (``"causal"``), `.fx` text (a whole program, or just the expression), a ``flexjit.dsl``
    expression, a Python function of dsl leaves (``lambda score, b, h, q, kv: ...``;
    ``lambda b, h, q_idx: sinks[h]`` for a sink_mod) or Mods. Every form of the same mod gives
    equal Mods with the same hash (the kernel cache key). A name or text given for one side
    contributes only that side (``score_mod="alibi_causal"`` is ALiBi without the causal mask)
    once another side is given too, except that a program's sink_mod goes with it
    (``mask_mod="buffer sinks: f32[H]\\nmask_mod = q_idx >= kv_idx\\nsink_mod = sinks[h]"``);
    a Mods object is taken whole. The sink_mod (an attention sink, docs/attention.md) is one f32
    logit per row (b, h, q_idx) that joins the softmax denominator and carries no value."""
    sides = [(score_mod, _mods_of(score_mod, "score_mod"), "score_mod"),
             (mask_mod, _mods_of(mask_mod, "mask_mod"), "mask_mod"),
             (sink_mod, _mods_of(sink_mod, "sink_mod"), "sink_mod")]
    given = [(spec, mods, kind) for spec, mods, kind in sides if mods is not None]
    if not given:
        return Mods()
    if len(given) == 1:
        return given[0][1]
    result = None
    for spec, mods, kind in given:
        if not isinstance(spec, Mods):  # only its side (and a program's sink_mod)
            side = {kind: getattr(mods, kind), "sink_mod": mods.sink_mod}
            mods = Mods(**side, name=mods.name)
        result = mods if result is None else combine(result, mods)
    return result


# --- arrays of the caller's framework ------------------------------------------------------


def _framework(x: Any) -> str:
    return type(x).__module__.split(".")[0]


_torch_tensor: Any = None  # torch.Tensor, once a torch array has been seen
_to_dlpack: Any = None


def _arrays(*xs: Any) -> list:
    """The arrays of a call as the C++ binding takes them: a torch tensor as a DLPack capsule
    (torch.utils.dlpack.to_dlpack, ~0.5 us) instead of the tensor, whose ``__dlpack__`` the
    binding would call (a Python method of ~6 us with PyTorch 2.11; a call passes 4-6 arrays,
    docs/python.md "Overhead"); other arrays and None as they are."""
    global _torch_tensor, _to_dlpack
    out = []
    for x in xs:
        if _torch_tensor is not None and isinstance(x, _torch_tensor):
            out.append(_to_dlpack(x))
        elif x is not None and _torch_tensor is None and _framework(x) == "torch":
            import torch
            from torch.utils.dlpack import to_dlpack

            _torch_tensor, _to_dlpack = torch.Tensor, to_dlpack
            out.append(to_dlpack(x))
        else:
            out.append(x)
    return out


def _device(x: Any) -> int:
    """-1 for a CPU array, else the CUDA device ordinal."""
    dev_type, dev_id = x.__dlpack_device__()
    return -1 if int(dev_type) in (1, 3) else int(dev_id)  # kDLCPU, kDLCUDAHost


def _empty(like: Any, shape, gpu_dtype_of_q: bool) -> Any:
    """An uninitialised array in the framework of `like`: f32 on the CPU backend and for lse;
    the dtype of q for a GPU output (bf16 for float8_e4m3fn q: attention_out_dtype)."""
    fw = _framework(like)
    if fw == "torch":
        import torch

        dtype = like.dtype if gpu_dtype_of_q else torch.float32
        if dtype == getattr(torch, "float8_e4m3fn", None):
            dtype = torch.bfloat16
        return torch.empty(shape, dtype=dtype, device=like.device)
    if fw == "cupy":
        import cupy

        dtype = like.dtype if gpu_dtype_of_q else cupy.float32
        with like.device:
            return cupy.empty(shape, dtype=dtype)
    if fw == "numpy":
        import numpy

        return numpy.empty(shape, dtype=numpy.float32)
    raise TypeError(f"flexjit allocates outputs for NumPy, PyTorch and CuPy arrays; q is a {fw} "
                    f"array (convert it with that framework's from_dlpack)")


def _stream(like: Any, device: int) -> int:
    fw = _framework(like)
    if device < 0:
        return 0
    if fw == "torch":
        import torch

        # The raw-stream query Inductor's generated code uses: ~0.3 us against ~7 us for
        # torch.cuda.current_stream(device).cuda_stream (scripts/py_overhead.py).
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return raw(device)
        return torch.cuda.current_stream(like.device).cuda_stream
    if fw == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0


def _output_shapes(q: Any, k: Any, v: Any):
    """The shapes of out and lse. From the arrays' own shapes when they are plausible (each
    conversion to DLPack costs ~6 us with PyTorch, and the call converts them anyway); through
    the C++ validation otherwise, for its precise message. The call validates everything again
    before it launches."""
    try:
        qs, ks, vs = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    except AttributeError:
        qs = ks = vs = ()
    if (len(qs) == 4 and len(ks) == 4 and len(vs) == 4 and qs[0] == ks[0] == vs[0]
            and ks[1] == vs[1] and ks[1] > 0 and qs[1] % ks[1] == 0 and ks[2] == vs[2]
            and qs[3] == ks[3]):
        return [qs[0], qs[1], qs[2], vs[3]], [qs[0], qs[1], qs[2]]
    return _C._output_shapes(q, k, v)


def _params(params: Optional[Mapping[str, Any]]):
    return [(name, float(value)) for name, value in (params or {}).items()]


def _check_names(mods: Mods, block_mask: Optional[BlockMask], buffers, params) -> None:
    """A value for a buffer or param the mods do not declare is a mistake (a misspelt name):
    the GPU path says so, and the CPU backend would ignore it, so it is checked here for both.
    A block mask's mask_mod applies when the mods have none: its declarations count then."""
    if not buffers and not params:
        return
    extra = block_mask.mods if block_mask is not None and mods.mask_mod is None else None
    for kind, given in (("buffer", buffers), ("param", params)):
        if not given:
            continue
        names = [d.name for d in getattr(mods, kind + "s")]
        if extra is not None:
            names += [d.name for d in getattr(extra, kind + "s") if d.name not in names]
        for name in given:
            if name not in names:
                raise RuntimeError(
                    f"a value is given for {kind} '{name}', which the mods '{mods.name}' do not "
                    f"declare (their {kind}s: {', '.join(names) or 'none'})")


def _config(config: Optional[Mapping[str, Any]], check_buffers: bool = False) -> Optional[dict]:
    if not check_buffers:
        return None if config is None else dict(config)
    return {**(config or {}), "check_buffers": True}


def _buffers(buffers: Optional[Mapping[str, Any]]):
    if not buffers:
        return []
    return list(zip(buffers.keys(), _arrays(*buffers.values())))


def flex_attention(q: Any, k: Any, v: Any, score_mod: ModSpec = None, mask_mod: ModSpec = None,
                   block_mask: Optional[BlockMask] = None,
                   buffers: Optional[Mapping[str, Any]] = None,
                   params: Optional[Mapping[str, Any]] = None, scale: Optional[float] = None,
                   return_lse: bool = False, num_threads: int = 0, seq_lens: Any = None,
                   page_table: Any = None, check_pages: bool = False, sink_mod: ModSpec = None,
                   config: Optional[Mapping[str, Any]] = None, check_buffers: bool = False,
                   descale: Optional[Tuple[Any, Any, Any]] = None, k_scale: Any = None,
                   v_scale: Any = None):
    """softmax(score_mod(scale · q kᵀ) masked by mask_mod) · v, as torch's flex_attention.

    q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv]: DLPack arrays on one device,
    last dim contiguous (GQA when Hq is a multiple of Hkv). ``score_mod`` / ``mask_mod`` /
    ``sink_mod`` (an attention sink: one logit per row in the softmax denominator, with no
    value; lse includes it): see ``make_mods``. ``buffers``: arrays for the captured buffers, by
    name (same device);
    ``params``: values for runtime parameters (a parameter left out takes its default).
    ``block_mask``: from ``create_block_mask`` (on the GPU, the tiles to visit; its mask_mod is
    used when no mask_mod is given). ``scale`` defaults to 1/sqrt(D).

    A KV cache (docs/kernels/decode.md): ``seq_lens`` [B] int32 makes k / v ragged (sequence b
    attends to its first seq_lens[b] keys); with ``page_table`` [B, max_pages] int32 too, k and v
    are page pools [num_pages, page_size, Hkv, D]. Both on q's device; up to 16 query tokens
    take the split-KV decode kernels on a GPU. ``check_pages`` checks every length and page
    entry first (RuntimeError naming the first bad one). An e4m3 cache: k and v (pools or
    contiguous) of dtype float8_e4m3fn with ``k_scale`` / ``v_scale``, [Hkv] f32 arrays on q's
    device (key n of kv head h is k[n] * k_scale[h], its value v[n] * v_scale[h]); q is bf16 or
    f16 and out has q's dtype on a GPU (docs/kernels/decode.md "FP8 KV caches").

    ``check_buffers``: check every captured-buffer index against its buffer's extent — on a GPU
    in the kernels, which then read 0 there, and the call synchronizes and raises RuntimeError
    naming the first out-of-bounds load (buffer, index, extent, position); a debug mode, slower
    (docs/attention.md, "Checking buffer indices"). Also ``config={"check_buffers": True}``.

    FP8: q, k, v of dtype float8_e4m3fn (the sm_90a forward, or the CPU backend) with
    ``descale=(q_descale, k_descale, v_descale)``: f32 arrays on q's device of shape [1] (per
    tensor) or [Hq] / [Hkv] / [Hkv] (per head), None for a factor of 1; a real value is the stored
    one times its factor; out is bfloat16 on a GPU (docs/attention.md "FP8 inputs").

    Returns out [B, Hq, Sq, Dv] (f32 on the CPU backend, q's dtype on a GPU) or, with
    ``return_lse``, (out, lse [B, Hq, Sq] f32, natural log), arrays of q's framework. GPU work
    is queued on the framework's current stream. ``config``: how the GPU kernels run, a dict
    of block_m, block_n, num_warps, num_stages, num_splits, q_tiles, persistent (ints; 0 or
    None: the default), variant (a kernel variant's name), autotune ("off" | "cached" |
    "search") and math ("auto" | "exact" | "approx"), docs/python.md; the CPU backend checks
    it and runs its one exact kernel. Raises ``flexjit.Error`` subclasses (CompileError,
    UnsupportedError, RuntimeError, ...) with flexjit's messages.
    """
    mods = make_mods(score_mod, mask_mod, sink_mod)
    _check_names(mods, block_mask, buffers, params)
    if seq_lens is None and page_table is None and k_scale is None and v_scale is None:
        out_shape, lse_shape = _output_shapes(q, k, v)
    else:  # pools or ragged k / v: out has q's rows and v's head dim (validated in the call)
        qs = tuple(q.shape)
        if len(qs) != 4 or len(tuple(v.shape)) != 4:
            raise RuntimeError(f"q and v must have 4 dims on a KV cache; q has shape {qs}, "
                               f"v {tuple(v.shape)}")
        out_shape, lse_shape = [qs[0], qs[1], qs[2], tuple(v.shape)[3]], [qs[0], qs[1], qs[2]]
    device = _device(q)
    out = _empty(q, out_shape, gpu_dtype_of_q=device >= 0)
    lse = _empty(q, lse_shape, gpu_dtype_of_q=False) if return_lse else None
    q_, k_, v_, out_, lse_, seq_lens_, page_table_ = _arrays(q, k, v, out, lse, seq_lens,
                                                              page_table)
    if descale is not None and len(tuple(descale)) != 3:
        raise ValueError("descale must be (q_descale, k_descale, v_descale), each an f32 array "
                         "or None")
    qd, kd, vd = _arrays(*(tuple(descale) if descale is not None else (None, None, None)))
    ks, vs = _arrays(k_scale, v_scale)
    _C._flex_attention_into(q_, k_, v_, out_, lse_, mods, block_mask, _buffers(buffers),
                            _params(params), scale, _stream(q, device), num_threads,
                            seq_lens_, page_table_, check_pages,
                            config=_config(config, check_buffers), q_descale=qd, k_descale=kd,
                            v_descale=vd, k_scale=ks, v_scale=vs)
    return (out, lse) if return_lse else out


def create_block_mask(mask_mod: ModSpec, B: int, H: int, Q_LEN: int, KV_LEN: int,
                      device: Any = "cpu", BLOCK_SIZE: int = 128,
                      buffers: Optional[Mapping[str, Any]] = None,
                      params: Optional[Mapping[str, Any]] = None) -> BlockMask:
    """The block mask of ``mask_mod`` over [B, H, Q_LEN, KV_LEN] (B or H of 1 broadcast), as
    torch's create_block_mask. ``device``: "cpu" (built on the host by interval analysis and the
    interpreter), "cuda" / "cuda:N" / an int / a torch.device (built on that GPU)."""
    mods = make_mods(None, mask_mod)
    if mods.mask_mod is None:
        raise CompileError("create_block_mask needs a mask_mod")
    if mods.score_mod is not None:  # only the mask_mod and what it captures
        mods = Mods(mask_mod=mods.mask_mod, name=mods.name)
    declared = {b.name for b in mods.buffers} | {p.name for p in mods.params}
    buffers = {n: x for n, x in (buffers or {}).items() if n in declared}
    params = {n: x for n, x in (params or {}).items() if n in declared}
    dev = str(device)
    if isinstance(device, int):
        index = device
    elif dev == "cpu":
        index = -1
    elif dev.startswith("cuda"):
        index = int(dev.split(":")[1]) if ":" in dev else 0
    else:
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', not {device!r}")
    return _C._create_block_mask(mods, B, H, Q_LEN, KV_LEN, index, BLOCK_SIZE, _buffers(buffers),
                                 _params(params))


def flex_attention_backward(q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any,
                            score_mod: ModSpec = None, mask_mod: ModSpec = None,
                            block_mask: Optional[BlockMask] = None,
                            buffers: Optional[Mapping[str, Any]] = None,
                            params: Optional[Mapping[str, Any]] = None,
                            scale: Optional[float] = None, num_threads: int = 0,
                            dlse: Any = None, deterministic: bool = False,
                            sink_mod: ModSpec = None, config: Optional[Mapping[str, Any]] = None,
                            check_buffers: bool = False):
    """The gradients of ``flex_attention(q, k, v, ...)`` for an output gradient ``dout``.

    ``out`` and ``lse`` are what ``flex_attention(..., return_lse=True)`` returned with the same
    mods, block mask, buffers, params and scale. ``dlse`` (f32, lse's shape and device) is the
    gradient of the loss in ``lse`` when the loss uses it; None: it does not.
    ``deterministic``: buffer gradients from per-warp partials summed in a fixed order and dQ
    by a second pass (bitwise the same on every run, at the cost of a workspace and time;
    docs/backward.md) instead of fp32 atomics and, on sm_90a, dQ added by the dK/dV kernel;
    the CPU backend is always deterministic. Returns
    ``(dq, dk, dv, buffer_grads)``: arrays of q's framework (q / k / v's dtype on a GPU, f32 on
    the CPU backend) and a dict of f32 gradients, one per captured float buffer, in the
    buffer's shape. ``config``: as flex_attention's, without num_splits, q_tiles and
    persistent, with dq_mode ("auto" | "second_pass" | "atomic"). ``check_buffers``: as
    flex_attention's, for the backward's kernels.
    """
    mods = make_mods(score_mod, mask_mod, sink_mod)
    _check_names(mods, block_mask, buffers, params)
    device = _device(q)
    dq = _empty(q, tuple(q.shape), gpu_dtype_of_q=device >= 0)
    dk = _empty(k, tuple(k.shape), gpu_dtype_of_q=device >= 0)
    dv = _empty(v, tuple(v.shape), gpu_dtype_of_q=device >= 0)
    float_dtypes = ("f32", "f16", "bf16")
    grads = {}
    for decl in mods.buffers:
        if decl.dtype in float_dtypes and buffers and decl.name in buffers:
            grads[decl.name] = _zeros_f32(q, tuple(buffers[decl.name].shape))
    _C._flex_attention_backward_into(*_arrays(q, k, v, out, lse, dout, dlse, dq, dk, dv), mods,
                                     block_mask, _buffers(buffers), _params(params),
                                     [(n, a) for n, a in zip(grads, _arrays(*grads.values()))],
                                     scale, _stream(q, device), num_threads, deterministic,
                                     config=_config(config, check_buffers))
    return dq, dk, dv, grads


def _zeros_f32(like: Any, shape) -> Any:
    fw = _framework(like)
    if fw == "torch":
        import torch

        return torch.zeros(shape, dtype=torch.float32, device=like.device)
    if fw == "cupy":
        import cupy

        with like.device:
            return cupy.zeros(shape, dtype=cupy.float32)
    import numpy

    return numpy.zeros(shape, dtype=numpy.float32)


def _kernel_call(fn, score_mod: ModSpec, mask_mod: ModSpec, kernel: str, arch: str, dtype: str,
                 head_dim: int, head_dim_v: Optional[int], gqa_ratio: int, variant: str,
                 block_size: int):
    mods = make_mods(score_mod, mask_mod)
    return fn(mods, kernel, variant, arch, dtype, head_dim, head_dim_v or 0, gqa_ratio, block_size)


def emit(score_mod: ModSpec = None, mask_mod: ModSpec = None, kernel: str = "forward",
         arch: str = "", dtype: str = "bf16", head_dim: int = 128,
         head_dim_v: Optional[int] = None, gqa_ratio: int = 1, variant: str = "",
         block_size: int = 128) -> str:
    """The CUDA source flexjit generates for a kernel (``flexjit emit``): ``kernel`` is a family
    ("forward", "block_mask", "backward_dkdv", ...; ``kernel_variants()`` lists them), ``arch``
    "sm_80" ... "sm_90a" (empty: the current GPU's). No compilation, no GPU needed with an
    arch."""
    return _kernel_call(_C._emit_kernel, score_mod, mask_mod, kernel, arch, dtype, head_dim,
                        head_dim_v, gqa_ratio, variant, block_size)["source"]


def inspect(score_mod: ModSpec = None, mask_mod: ModSpec = None, kernel: str = "forward",
            arch: str = "", dtype: str = "bf16", head_dim: int = 128,
            head_dim_v: Optional[int] = None, gqa_ratio: int = 1, variant: str = "",
            block_size: int = 128) -> dict:
    """Compiles a kernel with NVRTC (through the kernel caches) and returns what ``flexjit
    inspect`` shows: description, selection, kernel_name, registers, spill_store_bytes,
    spill_load_bytes, stack_frame_bytes, static_shared_bytes, dynamic_smem_bytes, cubin_bytes,
    wgmma_serialized ("" unless ptxas serialized the kernel's wgmma), cache ("compiled" /
    "memory hit" / "disk hit"), compile_ms, source_key and source."""
    return _kernel_call(_C._compile_kernel, score_mod, mask_mod, kernel, arch, dtype, head_dim,
                        head_dim_v, gqa_ratio, variant, block_size)


def kernel_variants() -> list:
    """Every registered kernel variant (``flexjit kernels``): family, name, summary, auto_select,
    priority, templates, entry_points."""
    return _C._kernel_variants()


def kernel_families() -> list:
    """Every registered kernel family (``flexjit kernels --families``): name, summary, kind (the
    workload kind whose plan runs it; "" for none), math (whether a math mode applies) and
    config_keys (name, doc, min, max: the ints a call's ``config`` dict may set for it)."""
    return _C._kernel_families()
