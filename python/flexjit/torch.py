"""flexjit as a PyTorch operator: ``torch.ops.flexjit.flex_attention``, a
``torch.library.custom_op`` with a fake (meta) implementation, so the forward works in eager
mode and under ``torch.compile``.

    import flexjit.torch as fj
    out = fj.flex_attention(q, k, v, score_mod="alibi", mask_mod="causal",
                            buffers={"slopes": slopes})

Mods cross the operator as `.fx` text (the op parses each distinct text once). On a GPU, a
mask_mod gets a block mask built by flexjit's create_block_mask and cached per (mask, shapes,
params, device) unless the mask reads a buffer. Autograd: flexjit has no GPU backward yet, and
the CPU backward is not public; calling ``.backward()`` through this op raises RuntimeError.
"""


import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

import flexjit

_mods_by_text: Dict[str, flexjit.Mods] = {}
_block_masks: Dict[tuple, flexjit.BlockMask] = {}


def _mods(text: str) -> flexjit.Mods:
    mods = _mods_by_text.get(text)
    if mods is None:
        mods = flexjit.parse_mods(text)
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
        _block_masks[key] = bm
    return bm


@torch.library.custom_op("flexjit::flex_attention", mutates_args=())
def _flex_attention_op(q: Tensor, k: Tensor, v: Tensor, mods_text: str,
                       buffer_names: List[str], buffers: List[Tensor], param_names: List[str],
                       param_values: List[float], scale: Optional[float],
                       return_lse: bool) -> Tuple[Tensor, Tensor]:
    mods = _mods(mods_text)
    params = list(zip(param_names, param_values))
    block_mask = _block_mask(mods, q, k, params)
    out, lse = flexjit.flex_attention(q, k, v, mods, block_mask=block_mask,
                                      buffers=dict(zip(buffer_names, buffers)),
                                      params=dict(params), scale=scale, return_lse=True)
    if not return_lse:
        lse = lse.new_empty(0)
    return out, lse


@_flex_attention_op.register_fake
def _(q, k, v, mods_text, buffer_names, buffers, param_names, param_values, scale, return_lse):
    b, hq, sq, _ = q.shape
    out = q.new_empty((b, hq, sq, v.shape[-1]),
                      dtype=q.dtype if q.device.type == "cuda" else torch.float32)
    lse = q.new_empty((b, hq, sq) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def _no_backward(ctx, grad_out, grad_lse):
    raise RuntimeError(
        "flexjit.torch.flex_attention has no backward yet: flexjit's GPU backward does not exist "
        "and its CPU backward is not exposed to Python. Use torch.nn.attention.flex_attention "
        "for training, or run flexjit under torch.no_grad().")


def _setup_context(ctx, inputs, output):
    pass


_flex_attention_op.register_autograd(_no_backward, setup_context=_setup_context)


def _mods_text(score_mod: Any, mask_mod: Any) -> str:
    return flexjit.make_mods(score_mod, mask_mod).to_text()


try:  # a constant under torch.compile: the mods are fixed at a call site
    _mods_text = torch._dynamo.assume_constant_result(_mods_text)
except AttributeError:  # pragma: no cover
    pass


def flex_attention(q: Tensor, k: Tensor, v: Tensor, score_mod: Any = None, mask_mod: Any = None,
                   buffers: Optional[Mapping[str, Tensor]] = None,
                   params: Optional[Mapping[str, float]] = None, scale: Optional[float] = None,
                   return_lse: bool = False):
    """flexjit.flex_attention through the custom op (eager and torch.compile). Arguments as in
    flexjit.flex_attention, without block_mask (a GPU mask_mod gets a cached block mask)."""
    buffers = dict(buffers or {})
    params = dict(params or {})
    out, lse = torch.ops.flexjit.flex_attention(
        q, k, v, _mods_text(score_mod, mask_mod), list(buffers.keys()), list(buffers.values()),
        list(params.keys()), [float(x) for x in params.values()], scale, return_lse)
    return (out, lse) if return_lse else out
