"""flexjit as a PyTorch operator: ``torch.ops.flexjit.flex_attention``, a
``torch.library.custom_op`` with a fake (meta) implementation and an autograd formula, so the
forward and the backward work in eager mode and under ``torch.compile``.

    import flexjit.torch as fj
    out = fj.flex_attention(q, k, v, score_mod="alibi", mask_mod="causal",
                            buffers={"slopes": slopes})
    out.sum().backward()  # q.grad, k.grad, v.grad, and slopes.grad if slopes requires grad

Mods cross the operator as `.fx` text (the op parses each distinct text once). On a GPU, a
mask_mod gets a block mask built by flexjit's create_block_mask and cached per (mask, shapes,
params, device) unless the mask reads a buffer. Autograd goes through a second operator,
``torch.ops.flexjit.flex_attention_backward`` (flexjit's GPU backward on CUDA tensors, the CPU
backend's backward on CPU tensors): gradients for q, k, v and every captured floating-point
buffer; integer buffers and params get none. When ``return_lse=True`` the lse's gradient is
passed on too (a loss may use it).
"""


import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

import flexjit

_FLOAT_DTYPES = ("f32", "f16", "bf16")


def _names(joined: str) -> List[str]:
    """Buffer and param names cross the operators as one comma-separated string (a custom op's
    schema has no list of strings); the names are identifiers, so no name holds a comma."""
    return joined.split(",") if joined else []


_mods_by_text: Dict[str, flexjit.Mods] = {}
_block_masks: Dict[tuple, flexjit.BlockMask] = {}
_MAX_BLOCK_MASKS = 64  # the oldest is dropped first


def _mods(text: str) -> flexjit.Mods:
    mods = _mods_by_text.get(text)
    if mods is None:
        # No mods (plain attention) print as no text, which the parser refuses.
        mods = flexjit.parse_mods(text) if text else flexjit.Mods()
        _mods_by_text[text] = mods
    return mods


def _block_mask(mods: flexjit.Mods, q: Tensor, k: Tensor, params: List[Tuple[str, float]]):
    """A GPU block mask for the mods' mask_mod, cached unless the mask reads a buffer."""
    if mods.mask_mod is None or not q.is_cuda:
        return None
    mask = flexjit.Mods(mask_mod=mods.mask_mod)
    if mask.buffers:
        return None  # per-call contents: every tile visited, the mask_mod applied everywhere
    names = {p.name for p in mask.params}
    mask_params = tuple(sorted((n, v) for n, v in params if n in names))
    text = mask.to_text()
    # Broadcast over batch / heads unless the mask reads b / h.
    batch = q.shape[0] if re.search(r"\bb\b", text) else 1
    heads = q.shape[1] if re.search(r"\bh\b", text) else 1
    key = (text, batch, heads, q.shape[2], k.shape[2], q.device.index, mask_params)
    bm = _block_masks.get(key)
    if bm is None:
        bm = flexjit.create_block_mask(mask, batch, heads, q.shape[2], k.shape[2],
                                       device=q.device.index or 0, params=dict(mask_params))
        if len(_block_masks) >= _MAX_BLOCK_MASKS:
            # Bounded: decoding makes a new key per step (the KV length and the query offset
            # grow), which would otherwise keep every step's block mask alive.
            _block_masks.pop(next(iter(_block_masks)))
        _block_masks[key] = bm
    return bm


@torch.library.custom_op("flexjit::flex_attention", mutates_args=())
def _flex_attention_op(q: Tensor, k: Tensor, v: Tensor, mods_text: str,
                       buffer_names: str, buffers: List[Tensor], param_names: str,
                       param_values: List[float], scale: Optional[float],
                       return_lse: bool, deterministic: bool) -> Tuple[Tensor, Tensor]:
    """The forward. The lse is always computed and returned (the backward needs it);
    return_lse says whether the caller sees it, and so whether its gradient can be non-zero.
    deterministic is the backward's (kept for it by autograd); the forward is deterministic."""
    mods = _mods(mods_text)
    params = list(zip(_names(param_names), param_values))
    block_mask = _block_mask(mods, q, k, params)
    return flexjit.flex_attention(q, k, v, mods, block_mask=block_mask,
                                  buffers=dict(zip(_names(buffer_names), buffers)),
                                  params=dict(params),
                                  scale=scale, return_lse=True)


@_flex_attention_op.register_fake
def _(q, k, v, mods_text, buffer_names, buffers, param_names, param_values, scale, return_lse,
      deterministic):
    b, hq, sq, _ = q.shape
    out = q.new_empty((b, hq, sq, v.shape[-1]),
                      dtype=q.dtype if q.device.type == "cuda" else torch.float32)
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    return out, lse


def _grad_buffers(mods: flexjit.Mods, buffer_names: List[str]) -> List[bool]:
    """Per given buffer: whether flexjit computes its gradient (a floating-point declaration)."""
    dtypes = {d.name: d.dtype for d in mods.buffers}
    return [dtypes.get(name) in _FLOAT_DTYPES for name in buffer_names]


@torch.library.custom_op("flexjit::flex_attention_backward", mutates_args=())
def _flex_attention_backward_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                dout: Tensor, dlse: Optional[Tensor], mods_text: str,
                                buffer_names: str, buffers: List[Tensor],
                                param_names: str, param_values: List[float],
                                scale: Optional[float], deterministic: bool) -> List[Tensor]:
    """[dq, dk, dv, one per buffer]: dq / dk / dv in q's dtype on a GPU (f32 on the CPU
    backend); an f32 gradient of each floating-point buffer's shape, an empty tensor for an
    integer buffer. deterministic: the buffer gradients summed in a fixed order on the GPU
    (bitwise repeatable; the CPU backend always is)."""
    mods = _mods(mods_text)
    names = _names(buffer_names)
    params = list(zip(_names(param_names), param_values))
    block_mask = _block_mask(mods, q, k, params)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    if not q.is_cuda and dout.dtype != q.dtype:
        dout = dout.to(q.dtype)  # the CPU backward reads dout in q's dtype
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    dq, dk, dv, grads = flexjit.flex_attention_backward(
        q, k, v, out, lse, dout, mods, block_mask=block_mask,
        buffers=dict(zip(names, buffers)), params=dict(params), scale=scale, dlse=dlse,
        deterministic=deterministic)
    result = [dq, dk, dv]
    for name, has_grad in zip(names, _grad_buffers(mods, names)):
        result.append(grads[name] if has_grad else q.new_empty((0,), dtype=torch.float32))
    return result


@_flex_attention_backward_op.register_fake
def _(q, k, v, out, lse, dout, dlse, mods_text, buffer_names, buffers, param_names, param_values,
      scale, deterministic):
    dtype = q.dtype if q.device.type == "cuda" else torch.float32
    result = [q.new_empty(q.shape, dtype=dtype), k.new_empty(k.shape, dtype=dtype),
              v.new_empty(v.shape, dtype=dtype)]
    for b, has_grad in zip(buffers, _grad_buffers(_mods(mods_text), _names(buffer_names))):
        result.append(q.new_empty(b.shape if has_grad else (0,), dtype=torch.float32))
    return result


def _setup_context(ctx, inputs, output):
    (q, k, v, mods_text, buffer_names, buffers, param_names, param_values, scale,
     return_lse, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, *buffers)
    ctx.flexjit_args = (mods_text, buffer_names, param_names, list(param_values),
                        scale, return_lse, deterministic)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, *buffers = ctx.saved_tensors
    (mods_text, buffer_names, param_names, param_values, scale, return_lse,
     deterministic) = ctx.flexjit_args
    dlse = grad_lse if return_lse else None  # unseen by the caller: its gradient is zero
    grads = torch.ops.flexjit.flex_attention_backward(
        q, k, v, out, lse, grad_out, dlse, mods_text, buffer_names, buffers, param_names,
        param_values, scale, deterministic)
    dq, dk, dv = grads[0].to(q.dtype), grads[1].to(k.dtype), grads[2].to(v.dtype)
    dbuffers = [g.to(b.dtype) if b.is_floating_point() and g.shape == b.shape else None
                for b, g in zip(buffers, grads[3:])]
    # One entry per input in the inputs' structure: torch treats a list of floats as one leaf
    # (None), but an empty list as a list ([]).
    return (dq, dk, dv, None, None, dbuffers, None, (None if param_values else []), None, None,
            None)


_flex_attention_op.register_autograd(_backward, setup_context=_setup_context)


def _mods_text(score_mod: Any, mask_mod: Any, sink_mod: Any = None) -> str:
    """The mods as one line of `.fx` text (statements joined by ';'): the text is a constant
    argument of the ops, and Inductor copies constant arguments into comments of the code it
    generates, where a newline would end the comment and break the module (seen with the
    backward under torch.compile)."""
    text = flexjit.make_mods(score_mod, mask_mod, sink_mod).to_text()
    return "; ".join(line for line in text.splitlines() if line.strip())


try:  # a constant under torch.compile: the mods are fixed at a call site
    _mods_text = torch._dynamo.assume_constant_result(_mods_text)
except AttributeError:  # pragma: no cover
    pass


def flex_attention(q: Tensor, k: Tensor, v: Tensor, score_mod: Any = None, mask_mod: Any = None,
                   buffers: Optional[Mapping[str, Tensor]] = None,
                   params: Optional[Mapping[str, float]] = None, scale: Optional[float] = None,
                   return_lse: bool = False, deterministic: bool = False, sink_mod: Any = None):
    """flexjit.flex_attention through the custom op (eager, autograd and torch.compile).
    Arguments as in flexjit.flex_attention, without block_mask (a GPU mask_mod gets a cached
    block mask). Differentiable in q, k, v and the floating-point buffers (an attention sink's
    ``sinks`` buffer too: ``sink_mod="buffer sinks: f32[H]\\nsink_mod = sinks[h]"``,
    ``buffers={"sinks": s}``); deterministic=True
    makes the backward's buffer gradients bitwise repeatable on the GPU (per-warp partials
    summed in a fixed order, as flexjit.flex_attention_backward(deterministic=True))."""
    buffers = dict(buffers or {})
    params = dict(params or {})
    out, lse = torch.ops.flexjit.flex_attention(
        q, k, v, _mods_text(score_mod, mask_mod, sink_mod), ",".join(buffers),
        list(buffers.values()),
        ",".join(params), [float(x) for x in params.values()], scale, return_lse, deterministic)
    return (out, lse) if return_lse else out
