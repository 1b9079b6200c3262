"""flexjit as an attention implementation of Hugging Face transformers.

    import flexjit.transformers  # registers "flexjit"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flexjit")

Importing the module registers two functions under the name ``"flexjit"``:

- with ``AttentionMaskInterface`` (transformers.masking_utils), :func:`flexjit_mask`: instead of
  a dense ``[B, 1, q_len, kv_len]`` mask, the model's mask helpers (``create_causal_mask``,
  ``create_sliding_window_causal_mask``, ...) get a small :class:`FlexjitMask` that says what
  the mask is: causal or not, the sliding window, where the queries and keys sit in the
  sequence (the KV cache's offsets), and the padding as a ``[B, kv_len]`` key-validity tensor;
- with ``AttentionInterface`` (transformers.modeling_utils), :func:`flexjit_attention_forward`:
  it turns that description and the layer's arguments (``scaling``, ``softcap``, ``s_aux`` /
  ``sinks``, GQA) into flexjit mods and runs ``flexjit.torch.flex_attention`` (the custom op,
  with autograd) on the layer's q / k / v.

Each distinct configuration of features becomes one `.fx` program, parsed once; the values
that change from call to call (the query offset of a decoding step, the window, the softcap)
are runtime params, so a new value never recompiles a kernel. docs/transformers.md has the
table of what each feature maps to and what is refused.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Dict, Optional, Tuple

import torch

import flexjit
import flexjit.torch as _fjt

try:
    import transformers as _transformers
    from transformers import masking_utils as _masking
    from transformers.modeling_utils import AttentionInterface as _AttentionInterface
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"flexjit.transformers needs Hugging Face transformers with "
        f"transformers.modeling_utils.AttentionInterface and transformers.masking_utils "
        f"(developed against transformers 5.17): {_error}") from _error

_MASK_API = ("AttentionMaskInterface", "causal_mask_function", "bidirectional_mask_function",
             "sliding_window_overlay", "and_masks", "prepare_padding_mask", "sdpa_mask")
_missing = [name for name in _MASK_API if not hasattr(_masking, name)]
if _missing:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"flexjit.transformers: transformers {_transformers.__version__} has no "
        f"masking_utils.{', masking_utils.'.join(_missing)} (needed to receive the mask "
        f"description instead of a dense mask; developed against transformers 5.17)")

NAME = "flexjit"

__all__ = ["NAME", "FlexjitMask", "flexjit_attention_forward", "flexjit_mask", "register"]


@dataclasses.dataclass(frozen=True, eq=False)
class FlexjitMask:
    """What the model's mask is, handed from :func:`flexjit_mask` to the attention layers in
    place of a dense mask (transformers passes it on as the layers' ``attention_mask``).

    Query row ``i`` is sequence position ``q_offset + i``, key ``j`` is position
    ``kv_offset + j``. ``causal``: key position <= query position. ``window``: also query
    position - key position < window (transformers' sliding window). ``kv_valid``: a
    ``[B, kv_length]`` bool tensor, False at padding keys, or None when no key is padding.
    ``dense``: the whole mask as a ``[B, 1, q_length, kv_length]`` bool tensor, for a mask
    function this module does not recognise (then causal / window / kv_valid are unused)."""

    q_length: int
    kv_length: int
    q_offset: int = 0
    kv_offset: int = 0
    causal: bool = True
    window: Optional[int] = None
    kv_valid: Optional[torch.Tensor] = None
    dense: Optional[torch.Tensor] = None

    # generate() builds the masks ahead of the forward for a compileable (static) cache and hands
    # them to the model as its attention_mask; the model's mask helpers then take a 2D mask
    # (ndim 2) for padding. ndim 4 says "an already prepared mask": they pass it through to
    # flexjit_mask, which returns it unchanged.
    ndim = 4

    @property
    def query_offset(self) -> int:
        """The offset of the queries in key indices: key j is visible to query row i (when
        causal) iff j <= i + query_offset. For a KV cache that only grows, kv_length - q_length:
        the queries are the last q_length positions."""
        return self.q_offset - self.kv_offset


# --- the mask interface -------------------------------------------------------------------

_AND_MASK_CODE = _masking.and_masks(_masking.causal_mask_function).__code__
_SLIDING_OVERLAY_CODE = _masking.sliding_window_overlay(1).__code__


def _closure(fn: Callable, name: str) -> Any:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None or name not in code.co_freevars:
        return None
    return cells[code.co_freevars.index(name)].cell_contents


def _sliding_window_of(fn: Callable) -> Optional[int]:
    """The window of transformers' sliding_window_causal_mask_function(w), recognised by the
    code objects of and_masks and sliding_window_overlay; None for any other function."""
    if getattr(fn, "__code__", None) is not _AND_MASK_CODE:
        return None
    parts = _closure(fn, "mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2:
        return None
    overlay, causal = parts
    if causal is not _masking.causal_mask_function:
        return None
    if getattr(overlay, "__code__", None) is not _SLIDING_OVERLAY_CODE:
        return None
    window = _closure(overlay, "sliding_window")
    return window if isinstance(window, int) and window > 0 else None


_warned: set = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def flexjit_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0,
                 kv_offset: int = 0, mask_function: Callable = _masking.causal_mask_function,
                 attention_mask: Optional[torch.Tensor] = None, device: Any = "cpu",
                 **kwargs: Any) -> FlexjitMask:
    """The mask function transformers calls for ``attn_implementation="flexjit"`` (through
    ``AttentionMaskInterface``): a :class:`FlexjitMask` describing the mask, with the 2D
    padding mask kept as a per-batch key-validity tensor — no dense mask is materialised for
    transformers' causal, sliding-window-causal and bidirectional patterns. Any other pattern
    (packed sequences, chunked attention, or_mask_function / and_mask_function overlays, ...)
    is materialised by transformers' own ``sdpa_mask`` and read by the kernel as a captured
    bool buffer: correct, slower, and announced by a warning once. Other keyword arguments of
    the interface (``local_size``, ``allow_is_causal_skip``, ``dtype``, ``config``, ...) are
    not needed: the window is read from the mask function itself."""
    if isinstance(attention_mask, FlexjitMask):  # prepared by generate() (see FlexjitMask.ndim)
        if (attention_mask.q_length, attention_mask.kv_length) != (q_length, kv_length):
            raise ValueError(
                f"flexjit.transformers: a prepared FlexjitMask for q_len "
                f"{attention_mask.q_length} and kv_len {attention_mask.kv_length} is given "
                f"for q_len {q_length} and kv_len {kv_length}")
        return attention_mask
    if isinstance(q_offset, torch.Tensor):
        q_offset = int(q_offset)  # a static cache's offset lives on the device: one sync
    if mask_function is _masking.causal_mask_function:
        causal, window = True, None
    elif mask_function is _masking.bidirectional_mask_function:
        causal, window = False, None
    else:
        window = _sliding_window_of(mask_function)
        causal = window is not None
        if window is None:
            _warn_once(
                f"dense:{getattr(mask_function, '__qualname__', mask_function)}",
                f"flexjit.transformers: the mask function "
                f"{getattr(mask_function, '__qualname__', mask_function)!r} is not one of "
                f"transformers' causal / sliding-window / bidirectional masks; it is "
                f"materialised as a dense [B, 1, q_len, kv_len] bool mask and read by the "
                f"kernel (correct, but every key tile is visited)")
            dense = _masking.sdpa_mask(
                batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
                attention_mask=attention_mask, allow_is_causal_skip=False,
                allow_is_bidirectional_skip=False, use_vmap=kwargs.get("use_vmap", False),
                device=device)
            return FlexjitMask(q_length, kv_length, q_offset, kv_offset, causal=False,
                               dense=dense)
    kv_valid = None
    if attention_mask is not None:
        padding = _masking.prepare_padding_mask(attention_mask, kv_length, kv_offset)
        padding = padding[:, kv_offset:kv_offset + kv_length].to(device=device, dtype=torch.bool)
        if padding.shape != (batch_size, kv_length):
            raise ValueError(
                f"flexjit.transformers: the 2D attention mask gives keys "
                f"{tuple(padding.shape)} for batch {batch_size} and kv_length {kv_length} "
                f"(kv_offset {kv_offset}); expected [batch, kv_length]")
        if not bool(padding.all()):  # one sync; a mask without padding keeps the block mask
            kv_valid = padding.contiguous()
    return FlexjitMask(q_length, kv_length, q_offset, kv_offset, causal=causal, window=window,
                       kv_valid=kv_valid)


# --- the mods -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Features:
    """What one call's mods have to express (the key of the Mods cache)."""

    causal: bool
    window: bool
    kv_valid: bool
    dense: str  # "", "bool" or "float": a [B, HM, Q, KV] mask buffer
    dense_per_head: bool
    softcap: bool
    sinks: bool


_mods_cache: Dict[_Features, Dict[str, str]] = {}


def _fx_text(f: _Features) -> str:
    """The `.fx` program of a feature set (docs/transformers.md lists each line's origin)."""
    decls, mask, score = [], [], "score"
    if f.causal or f.window:
        decls.append("param q_off: i32 = 0")  # queries are the last rows: key j <= i + q_off
    if f.causal:
        mask.append("kv_idx <= q_idx + q_off")
    if f.window:
        decls.append("param window: i32 = 4096")
        mask.append("q_idx + q_off - kv_idx < window")
    if f.kv_valid:
        decls.append("buffer kv_valid: bool[B, KV]")
        mask.append("kv_valid[b, kv_idx]")
    head = "h" if f.dense_per_head else "0"
    if f.dense == "bool":
        decls.append("buffer dense_mask: bool[B, HM, Q, KV]")
        mask.append(f"dense_mask[b, {head}, q_idx, kv_idx]")
    if f.softcap:
        decls.append("param softcap: f32 = 50")
        score = "softcap * tanh(score / softcap)"
    if f.dense == "float":
        decls.append("buffer dense_bias: f32[B, HM, Q, KV]")
        score = f"{score} + dense_bias[b, {head}, q_idx, kv_idx]"
    if f.sinks:
        decls.append("buffer sinks: f32[H]")
    lines = list(decls)
    if score != "score":
        lines.append(f"score_mod = {score}")
    if mask:
        lines.append("mask_mod = " + " && ".join(mask))
    if f.sinks:
        lines.append("sink_mod = sinks[h]")
    return "\n".join(lines)


def _mods(f: _Features) -> Dict[str, str]:
    """The `.fx` program of a feature set as flexjit.torch.flex_attention's keyword argument
    (empty for plain attention), built once. Text, not a Mods object: flexjit.torch folds it
    into the custom op's constant argument. A whole program given as its only side is taken
    whole, so it goes in as a side it defines."""
    if f not in _mods_cache:
        text = _fx_text(f)
        side: Dict[str, str] = {}
        if text:
            mods = flexjit.parse_mods(text)  # errors here, at the first call, naming the program
            kind = next(k for k in ("mask_mod", "score_mod", "sink_mod")
                        if getattr(mods, k) is not None)
            side = {kind: text}
        _mods_cache[f] = side
    return _mods_cache[f]


# --- the attention function ---------------------------------------------------------------


def _positive_float(value: Any, what: str) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    if not value > 0:
        raise ValueError(f"flexjit.transformers: {what} = {value}; it must be positive")
    return value


# Under torch.compile (transformers compiles the forward of generate() with a static cache) the
# attention runs as a graph break: eagerly, between the compiled parts around it, so that its
# host-side decisions (mods, block masks, the decode path) stay Python.
@torch.compiler.disable
def flexjit_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                              value: torch.Tensor, attention_mask: Any, dropout: float = 0.0,
                              scaling: Optional[float] = None, sliding_window: Optional[int] = None,
                              softcap: Optional[float] = None, s_aux: Optional[torch.Tensor] = None,
                              sinks: Optional[torch.Tensor] = None,
                              is_causal: Optional[bool] = None,
                              position_bias: Optional[torch.Tensor] = None,
                              **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """The attention function transformers calls for ``attn_implementation="flexjit"``.

    query ``[B, Hq, q_len, D]``, key / value ``[B, Hkv, kv_len, D]`` (Hq a multiple of Hkv:
    GQA is flexjit's own, K/V are not repeated); ``attention_mask`` a :class:`FlexjitMask`
    (from :func:`flexjit_mask`), a 4D bool or additive float mask given by the caller, or None
    (then ``is_causal`` or the module's ``is_causal`` and ``sliding_window`` decide, with the
    queries as the last q_len keys). Returns ``(out [B, q_len, Hq, Dv], None)`` in q's dtype:
    flexjit returns no attention weights."""
    if dropout and float(dropout) > 0:
        raise ValueError(
            f"flexjit.transformers: attention dropout {dropout} is not supported (flexjit's "
            f"kernels have no dropout); call model.eval() for inference, or set the config's "
            f"attention_dropout to 0.0 to train (dropout is only applied in training mode)")
    if position_bias is not None:
        raise ValueError(
            "flexjit.transformers: a position_bias tensor (T5-style relative attention bias) is "
            "not supported; use attn_implementation='sdpa' or 'eager' for this model")
    if kwargs.get("output_attentions", False):
        _warn_once("output_attentions",
                   "flexjit.transformers: output_attentions=True: flexjit returns no attention "
                   "weights (None); use attn_implementation='eager' to get them")
    if s_aux is not None and sinks is not None and s_aux is not sinks:
        raise ValueError("flexjit.transformers: both s_aux and sinks are given; pass one")
    sink = s_aux if s_aux is not None else sinks
    softcap = _positive_float(softcap, "softcap")

    b, hq, q_len, _ = query.shape
    hkv, kv_len = key.shape[1], key.shape[2]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"flexjit.transformers: {hq} query heads are not a multiple of {hkv} "
                         f"key/value heads")

    buffers: Dict[str, torch.Tensor] = {}
    params: Dict[str, float] = {}
    dense, dense_per_head = "", False
    mask = attention_mask
    if isinstance(mask, FlexjitMask):
        if (mask.q_length, mask.kv_length) != (q_len, kv_len):
            raise ValueError(
                f"flexjit.transformers: the mask was made for q_len {mask.q_length} and kv_len "
                f"{mask.kv_length}, but the layer has q_len {q_len} and kv_len {kv_len} (the "
                f"mask of another layer type, or of another cache layer?)")
        causal, window, q_off = mask.causal, mask.window, mask.query_offset
        if mask.kv_valid is not None:
            buffers["kv_valid"] = mask.kv_valid
        mask = mask.dense
    elif mask is None:
        causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))
        window = sliding_window if causal else None
        q_off = kv_len - q_len
    else:
        causal, window, q_off = False, None, 0
    if isinstance(mask, torch.Tensor):
        if mask.dim() != 4 or mask.shape[-2:] != (q_len, kv_len) or mask.shape[1] not in (1, hq):
            raise ValueError(
                f"flexjit.transformers: an attention mask of shape {tuple(mask.shape)}; "
                f"expected a 4D [B or 1, 1 or {hq}, {q_len}, {kv_len}] bool or additive float "
                f"mask (or the FlexjitMask of flexjit.transformers.flexjit_mask)")
        dense_per_head = mask.shape[1] == hq and hq > 1
        heads = hq if dense_per_head else 1
        if mask.dtype == torch.bool:
            dense = "bool"
            buffers["dense_mask"] = mask.expand(b, heads, q_len, kv_len).contiguous()
        elif mask.is_floating_point():
            dense = "float"
            buffers["dense_bias"] = mask.to(torch.float32).expand(b, heads, q_len,
                                                                    kv_len).contiguous()
        else:
            raise ValueError(f"flexjit.transformers: an attention mask of dtype {mask.dtype}; "
                             f"expected bool (True = attend) or an additive float mask")
    elif mask is not None:
        raise TypeError(f"flexjit.transformers: attention_mask is a {type(mask).__name__}; "
                        f"expected a FlexjitMask, a 4D tensor or None")

    if window is not None:
        window = int(window)
        if window <= 0:
            raise ValueError(f"flexjit.transformers: sliding_window = {window}; it must be "
                             f"positive")
        params["window"] = window
    if causal or window is not None:
        params["q_off"] = q_off
    if softcap is not None:
        params["softcap"] = softcap
    if sink is not None:
        if sink.numel() != hq:
            raise ValueError(f"flexjit.transformers: attention sinks with {sink.numel()} values "
                             f"for {hq} query heads; expected one per head")
        buffers["sinks"] = sink.reshape(hq).to(torch.float32)  # differentiable cast

    features = _Features(causal=bool(causal), window=window is not None,
                         kv_valid="kv_valid" in buffers, dense=dense,
                         dense_per_head=dense_per_head, softcap=softcap is not None,
                         sinks=sink is not None)
    out = _fjt.flex_attention(query, key, value, **_mods(features), buffers=buffers,
                              params=params, scale=scaling, enable_gqa=True)
    if out.dtype != query.dtype:  # the CPU backend computes and returns f32
        out = out.to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> str:
    """Registers flexjit's attention and mask functions with transformers under ``name``
    (``"flexjit"`` by default; importing flexjit.transformers does this once). Returns the
    name to pass as ``attn_implementation``."""
    _AttentionInterface.register(name, flexjit_attention_forward)
    _masking.AttentionMaskInterface.register(name, flexjit_mask)
    return name


register()
