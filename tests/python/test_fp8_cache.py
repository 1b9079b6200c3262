# e4m3 KV caches from Python (issue 31, "FP8"; docs/python.md, docs/kernels/decode.md "FP8 KV
# caches"): flexjit.flex_attention(..., k_scale=, v_scale=) on page pools and contiguous ragged
# caches of torch.float8_e4m3fn with per-kv-head scales, against the fp64 attention of the
# dequantized cache (the CPU backend; the GPU decode kernels within docs/math.md's rule), and
# every misuse as a flexjit.RuntimeError naming the bad value.
import numpy as np
import pytest

import flexjit

from reference import attention_f64, rel_error

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this torch has no float8_e4m3fn", allow_module_level=True)

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no GPU")

# The queries sit at the end of each sequence: query i of sequence b is token lens[b] - Sq + i.
AT_END = "buffer q_pos: i32[B]\nmask_mod = q_idx + q_pos[b] >= kv_idx"


def _quantized_per_head(x, head_dim):
    """x quantized per kv head as serving stacks fill an e4m3 cache: x / (amax_h / 448) in e4m3.
    Returns the e4m3 tensor and its [Hkv] f32 scales."""
    dims = tuple(d for d in range(x.dim()) if d != head_dim)
    scale = (x.abs().amax(dim=dims) / 448.0).clamp_min(1e-6).float()
    shape = [1] * x.dim()
    shape[head_dim] = -1
    return (x / scale.view(shape)).to(torch.float8_e4m3fn), scale


def _dequantized(x8, scale, head_dim):
    shape = [1] * x8.dim()
    shape[head_dim] = -1
    return x8.double() * scale.double().view(shape)


def _reference(q, k, v, lens, at_end):
    """fp64 out [B, Hq, Sq, D] of q against each sequence's first lens[b] keys of the logical
    [B, Hkv, S, D] k / v (already dequantized)."""
    out = np.zeros(tuple(q.shape[:3]) + (v.shape[3],))
    sq = q.shape[2]
    for b, n in enumerate(lens.tolist()):
        if n == 0:  # no keys: out 0
            continue
        mask = (lambda _b, _h, qi, kv, p=n - sq: qi + p >= kv) if at_end else None
        out[b:b + 1], _ = attention_f64(q[b:b + 1].double().numpy(), k[b:b + 1, :, :n].numpy(),
                                        v[b:b + 1, :, :n].numpy(), mask_mod=mask)
    return out


def _cache(batch, hkv, capacity, d, seed):
    """A logical e4m3 cache [B, Hkv, capacity, D] of N(0, 1) keys and 3 * N(0, 1) values with
    per-head scales: (k8, k_scale, v8, v_scale, k, v) with k, v the dequantized fp64 values."""
    g = torch.Generator().manual_seed(seed)
    k8, ks = _quantized_per_head(torch.randn(batch, hkv, capacity, d, generator=g), 1)
    v8, vs = _quantized_per_head(3 * torch.randn(batch, hkv, capacity, d, generator=g), 1)
    return k8, ks, v8, vs, _dequantized(k8, ks, 1), _dequantized(v8, vs, 1)


def _paged(k8, v8, page_size, seed):
    """The logical cache [B, Hkv, S, D] scattered into pools [num_pages, page_size, Hkv, D]
    through a shuffled page table [B, S / page_size] (and 3 unused pages)."""
    batch, hkv, cap, d = k8.shape
    per_seq = cap // page_size
    num_pages = batch * per_seq + 3
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
    table = perm[:batch * per_seq].view(batch, per_seq).to(torch.int32)
    pools = []
    for x8 in (k8, v8):
        pool = torch.zeros(num_pages, page_size, hkv, d, dtype=torch.float8_e4m3fn)
        pages = x8.view(torch.uint8).permute(0, 2, 1, 3).reshape(batch, per_seq, page_size, hkv, d)
        pool.view(torch.uint8)[table.long()] = pages
        pools.append(pool)
    return pools[0], pools[1], table


def _queries(batch, hq, sq, d, dtype, seed):
    return torch.randn(batch, hq, sq, d, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _check(out, want, dtype, device):
    out = out.double().cpu().numpy()
    assert np.isfinite(out).all()
    if device == "cpu":  # f32 on the dequantized values: only f32 roundings
        assert rel_error(out, want) <= 1e-5
        np.testing.assert_allclose(out, want, atol=1e-4, rtol=1e-4)
    else:  # docs/math.md "FP8 KV caches": the bf16 / f16 decode's rule
        assert rel_error(out, want) <= (1e-2 if dtype == torch.bfloat16 else 3e-3)


def _run_paged(device, dtype, sq, page_size, seed):
    batch, hq, hkv, d, cap = 3, 8, 2, 64, 96
    k8, ks, v8, vs, k, v = _cache(batch, hkv, cap, d, seed)
    k_pool, v_pool, table = _paged(k8, v8, page_size, seed + 1)
    lens = torch.tensor([cap, 37, sq + 2], dtype=torch.int32)
    q = _queries(batch, hq, sq, d, dtype, seed + 2)
    want = _reference(q, k, v, lens, at_end=True)
    dev = [t.to(device) for t in (q, k_pool, v_pool, table, lens, ks, vs)]
    out = flexjit.flex_attention(dev[0], dev[1], dev[2], mask_mod=AT_END,
                                 buffers={"q_pos": dev[4] - sq}, seq_lens=dev[4],
                                 page_table=dev[3], k_scale=dev[5], v_scale=dev[6])
    assert out.shape == (batch, hq, sq, d)
    assert out.dtype == (torch.float32 if device == "cpu" else dtype)
    _check(out, want, dtype, device)


def _run_contiguous(device, dtype, sq, seed):
    batch, hq, hkv, d, cap = 2, 4, 4, 128, 80
    k8, ks, v8, vs, k, v = _cache(batch, hkv, cap, d, seed)
    lens = torch.tensor([cap, 0], dtype=torch.int32)  # a sequence of length 0: out 0
    q = _queries(batch, hq, sq, d, dtype, seed + 2)
    want = _reference(q, k, v, lens, at_end=False)
    dev = [t.to(device) for t in (q, k8, v8, lens, ks, vs)]
    out, lse = flexjit.flex_attention(dev[0], dev[1], dev[2], seq_lens=dev[3], k_scale=dev[4],
                                      v_scale=dev[5], return_lse=True)
    _check(out, want, dtype, device)
    assert bool((out[1] == 0).all()) and bool(torch.isneginf(lse[1]).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sq,page_size", [(1, 16), (4, 8), (20, 32)])
def test_cpu_paged_e4m3_cache_is_the_attention_of_the_dequantized_cache(dtype, sq, page_size):
    _run_paged("cpu", dtype, sq, page_size, seed=10 + sq)


@pytest.mark.parametrize("sq", [1, 6])
def test_cpu_contiguous_e4m3_cache_is_the_attention_of_the_dequantized_cache(sq):
    _run_contiguous("cpu", torch.bfloat16, sq, seed=30 + sq)


# --- errors -----------------------------------------------------------------------------------


def _small():
    """q bf16 [2, 4, 1, 32] and a contiguous e4m3 cache [2, 2, 48, 32] with its scales and
    lengths."""
    k8, ks, v8, vs, _, _ = _cache(2, 2, 48, 32, seed=50)
    q = _queries(2, 4, 1, 32, torch.bfloat16, seed=51)
    return q, k8, v8, ks, vs, torch.tensor([48, 20], dtype=torch.int32)


def _raises(match, *args, **kwargs):
    with pytest.raises(flexjit.RuntimeError, match=match):
        flexjit.flex_attention(*args, **kwargs)


def test_e4m3_cache_without_scales_names_the_missing_scale():
    q, k8, v8, ks, vs, lens = _small()
    _raises(r"an e4m3 KV cache needs k_scale: \[Hkv\] = \[2\] f32", q, k8, v8, seq_lens=lens)
    _raises(r"an e4m3 KV cache needs v_scale: \[Hkv\] = \[2\] f32", q, k8, v8, seq_lens=lens,
            k_scale=ks)


def test_scales_without_an_e4m3_cache_are_refused():
    q, k8, v8, ks, vs, lens = _small()
    k, v = k8.to(torch.bfloat16), v8.to(torch.bfloat16)
    _raises("the KV cache has k_scale but k and v are bf16; the scales dequantize e4m3 pools "
            "only", q, k, v, seq_lens=lens, k_scale=ks, v_scale=vs)
    _raises("the KV cache has v_scale but k and v are bf16", q, k, v, seq_lens=lens, v_scale=vs)
    # Scales with no cache at all (neither seq_lens nor page_table).
    _raises("k_scale given without seq_lens or page_table", q, k8, v8, k_scale=ks, v_scale=vs)
    _raises("v_scale given without seq_lens or page_table", q, k8, v8, v_scale=vs)
    # The forward's descale factors are not a cache's scales.
    _raises(r"descale\.k was given with a KV cache", q,
            k8, v8, seq_lens=lens, k_scale=ks, v_scale=vs, descale=(None, ks, None))


def test_scale_of_the_wrong_shape_dtype_or_layout_is_named():
    q, k8, v8, ks, vs, lens = _small()
    _raises(r"k_scale has shape \[1\]; expected \[Hkv\] = \[2\]", q, k8, v8, seq_lens=lens,
            k_scale=ks[:1], v_scale=vs)
    _raises(r"v_scale has shape \[2, 1\]; expected \[Hkv\] = \[2\]", q, k8, v8, seq_lens=lens,
            k_scale=ks, v_scale=vs.view(2, 1))
    _raises("v_scale has dtype f16; expected f32", q, k8, v8, seq_lens=lens, k_scale=ks,
            v_scale=vs.half())
    _raises("k_scale has dtype float64; flexjit takes float32 for k_scale", q, k8, v8,
            seq_lens=lens, k_scale=ks.double(), v_scale=vs)
    strided = torch.stack([ks, ks], dim=1)[:, 0]  # [2] with stride 2
    _raises(r"k_scale is not contiguous \(strides \[2\]\)", q, k8, v8, seq_lens=lens,
            k_scale=strided, v_scale=vs)


def test_mixed_or_unsupported_dtypes_with_an_e4m3_cache_are_named():
    q, k8, v8, ks, vs, lens = _small()
    _raises("k is e4m3 and v is bf16; an e4m3 KV cache has both k and v in e4m3", q, k8,
            v8.to(torch.bfloat16), seq_lens=lens, k_scale=ks, v_scale=vs)
    _raises("q has dtype f32; with an e4m3 KV cache q is bf16 or f16", q.float(), k8, v8,
            seq_lens=lens, k_scale=ks, v_scale=vs)


def test_e4m3_page_pool_errors_name_the_pool():
    q, k8, v8, ks, vs, lens = _small()
    k_pool, v_pool, table = _paged(k8, v8, 16, seed=52)
    _raises(r"an e4m3 KV cache needs k_scale", q, k_pool, v_pool, seq_lens=lens,
            page_table=table)
    _raises(r"k_scale has shape \[4\]; expected \[Hkv\] = \[2\]", q, k_pool, v_pool,
            seq_lens=lens, page_table=table, k_scale=torch.ones(4), v_scale=vs)
    _raises(r"the k and v pools differ in pages or page size", q, k_pool, v_pool[:-1],
            seq_lens=lens, page_table=table, k_scale=ks, v_scale=vs)


# --- GPU (the split-KV decode kernels; sm_89 and newer) ---------------------------------------


def _needs_fp8_decode():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("e4m3 KV caches decode on sm_89 and newer")


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sq,page_size", [(1, 16), (4, 8), (20, 32)])
def test_gpu_paged_e4m3_cache_within_the_fp8_cache_rule(dtype, sq, page_size):
    _needs_fp8_decode()
    _run_paged("cuda", dtype, sq, page_size, seed=60 + sq)


@gpu
@pytest.mark.parametrize("sq", [1, 6])
def test_gpu_contiguous_e4m3_cache_within_the_fp8_cache_rule(sq):
    _needs_fp8_decode()
    _run_contiguous("cuda", torch.bfloat16, sq, seed=80 + sq)


@gpu
def test_gpu_scale_on_the_host_is_named():
    _needs_fp8_decode()
    q, k8, v8, ks, vs, lens = _small()
    dev = [t.cuda() for t in (q, k8, v8, vs, lens)]
    _raises(r"k_scale is on cpu but q is on cuda:0", dev[0], dev[1], dev[2], seq_lens=dev[4],
            k_scale=ks, v_scale=dev[3])
