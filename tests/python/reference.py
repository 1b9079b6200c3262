"""An fp64 NumPy reference of flex_attention and NumPy versions of some standard mods."""
import numpy as np


def attention_f64(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """out [B, Hq, Sq, Dv] and lse [B, Hq, Sq] in float64; score_mod(s, b, h, q, kv) and
    mask_mod(b, h, q, kv) take broadcastable integer index arrays."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    k = np.repeat(k, Hq // Hkv, axis=1)
    v = np.repeat(v, Hq // Hkv, axis=1)
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    b = np.arange(B)[:, None, None, None]
    h = np.arange(Hq)[None, :, None, None]
    qi = np.arange(Sq)[None, None, :, None]
    ki = np.arange(Skv)[None, None, None, :]
    if score_mod is not None:
        s = score_mod(s.astype(np.float32).astype(np.float64), b, h, qi, ki)
    if mask_mod is not None:
        keep = np.broadcast_to(mask_mod(b, h, qi, ki), s.shape)
        s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    out = np.einsum("bhqk,bhkd->bhqd", p, v) / np.where(denom > 0, denom, 1.0)
    lse = np.where(denom[..., 0] > 0, np.log(np.where(denom[..., 0] > 0, denom[..., 0], 1.0)) + m[..., 0], -np.inf)
    return out, lse


def rel_error(out, ref):
    """The C++ suite's rule: relative Frobenius error ||out - ref|| / ||ref||."""
    out = np.asarray(out, dtype=np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def alibi_slopes(H):
    return np.exp2(-8.0 * (np.arange(H) + 1) / H).astype(np.float32)


causal = lambda b, h, q, kv: q >= kv  # noqa: E731
