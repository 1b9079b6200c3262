"""flexjit with PyTorch: the framework round trip and the custom op's autograd on the CPU, and
on a GPU the forward against torch.nn.attention.flex_attention on the standard mods and the
backward (autograd through the op) against the same attention in fp64 torch ops, with the C++
suite's error rules (tests/gpu/test_forward.cpp, test_backward.cpp): forward relative
Frobenius error vs an fp64 reference <= 1e-2 (bf16), 3e-3 (f16), lse max relative error
<= 1e-2; gradients <= 2e-2 (bf16), 5e-3 (f16); no non-finite values. Skipped without PyTorch
(CI) or without a GPU, with the reason printed by `pytest -rs`."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flexjit  # noqa: E402
import flexjit.torch as fjt  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no GPU")
TOL = {torch.bfloat16: 1e-2, torch.float16: 3e-3}


def rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def test_torch_cpu_tensors_give_torch_tensors():
    q = torch.randn(1, 2, 64, 16)
    out, lse = flexjit.flex_attention(q, q, q, mask_mod="causal", return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == q.shape
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), q.double(), q.double(),
                                                           is_causal=True)
    assert rel(out, ref) < 1e-5


def test_custom_op_on_cpu_and_its_fake_shapes():
    q = torch.randn(1, 2, 64, 16)
    out = fjt.flex_attention(q, q, q, mask_mod="causal")
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), q.double(), q.double(),
                                                           is_causal=True)
    assert rel(out, ref) < 1e-5
    torch.library.opcheck(torch.ops.flexjit.flex_attention.default,
                          (q, q, q, "mask_mod = q_idx >= kv_idx", "", [], "", [], None, True,
                           False, [], [], ""),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))


def test_the_ops_mods_text_is_one_line():
    """Inductor copies the ops' constant arguments into comments of its generated code: a
    newline there broke the compiled backward (SyntaxError in the generated module)."""
    for score, mask in (("softcap", "causal"), ("alibi", "document_causal"), (None, None)):
        text = fjt._plan((score, mask, None)).text
        assert "\n" not in text
        assert fjt._mods(text) == flexjit.make_mods(score, mask)
    q = torch.randn(1, 2, 8, 16)
    ref = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert rel(fjt.flex_attention(q, q, q), ref) < 1e-5  # no mods at all


def dense_attention(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """The reference: attention in plain torch ops (differentiable, any dtype), the mods called
    once on broadcast index grids [B, H, Sq, Skv]. Returns (out, lse) with lse in natural log."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(Hq // Hkv, dim=1)
    v = v.repeat_interleave(Hq // Hkv, dim=1)
    scale = D ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    dev = q.device
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    h = torch.arange(Hq, device=dev).view(1, Hq, 1, 1)
    qi = torch.arange(Sq, device=dev).view(1, 1, Sq, 1)
    kv = torch.arange(Skv, device=dev).view(1, 1, 1, Skv)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, kv)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, kv).expand_as(s), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ v, lse


def rel_floor(x, ref):
    """|x - ref| / |ref| with |ref| floored at an RMS of 0.01 per element (the C++ backward
    tests' rule: where a gradient nearly cancels, its relative error says nothing)."""
    ref = ref.double()
    floor = 1e-2 * ref.numel() ** 0.5
    return ((x.double() - ref).norm() / max(ref.norm().item(), floor)).item()


def test_autograd_on_cpu_matches_a_dense_reference():
    g = torch.Generator().manual_seed(1)
    B, Hq, Hkv, S, D = 2, 4, 2, 33, 16
    q, k, v = (torch.randn(B, H, S, D, generator=g) for H in (Hq, Hkv, Hkv))
    slopes = torch.rand(Hq, generator=g)
    for t in (q, k, v, slopes):
        t.requires_grad_(True)
    dout = torch.randn(B, Hq, S, D, generator=g)
    dlse = torch.randn(B, Hq, S, generator=g)

    out, lse = fjt.flex_attention(q, k, v, enable_gqa=True, score_mod="alibi", mask_mod="causal",
                                  buffers={"slopes": slopes}, return_lse=True)
    ((out * dout).sum() + (lse * dlse).sum()).backward()

    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, slopes)]
    s64 = leaves[3]
    ref, ref_lse = dense_attention(*leaves[:3],
                                   score_mod=lambda s, b, h, qi, kv: s + s64[h] * (kv - qi),
                                   mask_mod=lambda b, h, qi, kv: qi >= kv)
    ((ref * dout.double()).sum() + (ref_lse * dlse.double()).sum()).backward()
    for name, t, r in zip(("dq", "dk", "dv", "dslopes"), (q, k, v, slopes), leaves):
        assert t.grad is not None and t.grad.dtype == torch.float32, name
        assert rel_floor(t.grad, r.grad) < 1e-4, name


def test_autograd_without_return_lse_and_with_integer_buffers():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 40, 16, generator=g, requires_grad=True)
    doc = (torch.arange(40) // 9).int()
    out = fjt.flex_attention(q, q, q, mask_mod="document_causal", buffers={"doc_id": doc})
    out.sum().backward()
    x = q.detach().double().requires_grad_(True)
    ref, _ = dense_attention(x, x, x, mask_mod=lambda b, h, qi, kv: (doc[qi] == doc[kv]) &
                             (qi >= kv))
    ref.sum().backward()
    assert rel_floor(q.grad, x.grad) < 1e-4
    assert doc.grad is None


@pytest.mark.parametrize("name", ["noop", "causal", "alibi_causal", "softcap_causal",
                                  "sliding_window", "prefix_lm", "document_causal"])
def test_autograd_on_cpu_every_standard_mod(name):
    """Buffers, params and masks through the autograd of the op (CPU backend, f32)."""
    B, Hq, Hkv, S, D = 1, 4, 2, 300, 16
    q = torch.randn(B, Hq, S, D, requires_grad=True)
    k = torch.randn(B, Hkv, S, D, requires_grad=True)
    v = torch.randn(B, Hkv, S, D, requires_grad=True)
    dout, dlse = torch.randn(B, Hq, S, D), torch.randn(B, Hq, S)
    smod, mmod, buffers, params = torch_mods(Hq, S, "cpu")[name]
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    if "slopes" in buffers:
        buffers = {"slopes": buffers["slopes"].clone().requires_grad_(True)}
        s64 = buffers["slopes"].detach().double().requires_grad_(True)
        leaves.append(s64)
        smod = lambda s, b, h, qi, kv: s + s64[h] * (kv - qi)  # noqa: E731
    out, lse = fjt.flex_attention(q, k, v, enable_gqa=True, score_mod=flexjit.standard_mods(name),
                                  buffers=buffers, params=params, return_lse=True)
    ((out * dout).sum() + (lse * dlse).sum()).backward()
    ref, ref_lse = dense_attention(*leaves[:3], score_mod=smod, mask_mod=mmod)
    ((ref * dout.double()).sum() + (ref_lse * dlse.double()).sum()).backward()
    tensors = [q, k, v] + ([buffers["slopes"]] if "slopes" in buffers else [])
    for t, r in zip(tensors, leaves):
        assert rel_floor(t.grad, r.grad) < 1e-4


def test_custom_op_deterministic_on_cpu():
    """deterministic=True through autograd on CPU tensors: the CPU backward is deterministic
    already, so the gradients are the default's, bit for bit."""
    q0 = torch.randn(1, 2, 48, 16)
    slopes0 = torch.rand(2)

    def grads(deterministic):
        q = q0.clone().requires_grad_()
        slopes = slopes0.clone().requires_grad_()
        fjt.flex_attention(q, q, q, score_mod="alibi", mask_mod="causal",
                           buffers={"slopes": slopes}, deterministic=deterministic).sum().backward()
        return q.grad, slopes.grad

    for a, b in zip(grads(True), grads(False)):
        assert torch.equal(a, b)


def test_backward_op_schema_and_fake():
    q = torch.randn(1, 2, 32, 16)
    slopes = torch.rand(2)
    mods = flexjit.make_mods("alibi", "causal").to_text()
    out, lse = torch.ops.flexjit.flex_attention(q, q, q, mods, "slopes", [slopes], "", [], None,
                                                True, False, [], [], "")
    torch.library.opcheck(torch.ops.flexjit.flex_attention_backward.default,
                          (q, q, q, out, lse, torch.randn_like(out), None, mods, "slopes",
                           [slopes], "", [], None, False, [], [], ""),
                          test_utils=("test_schema", "test_faketensor"))


# --- GPU: flexjit vs torch.nn.attention.flex_attention --------------------------------------



def torch_mods(H, S_total, device):
    slopes = torch.exp2(-8.0 * (torch.arange(H, device=device) + 1) / H).float()
    doc = (torch.arange(S_total, device=device) // 128).int()

    def causal(b, h, q, kv):
        return q >= kv

    def alibi(s, b, h, q, kv):
        return s + slopes[h] * (kv - q)

    def softcap(s, b, h, q, kv):
        return 30.0 * torch.tanh(s / 30.0)

    def window(b, h, q, kv):
        return (q >= kv) & (q - kv <= 256)

    def prefix(b, h, q, kv):
        return (kv <= 200) | (q >= kv)

    def document_causal(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    return {
        # flexjit name: (torch score_mod, torch mask_mod, buffers, params)
        "noop": (None, None, {}, {}),
        "causal": (None, causal, {}, {}),
        "alibi": (alibi, None, {"slopes": slopes}, {}),
        "alibi_causal": (alibi, causal, {"slopes": slopes}, {}),
        "softcap": (softcap, None, {}, {}),
        "softcap_causal": (softcap, causal, {}, {}),
        "sliding_window": (None, window, {}, {"window": 256}),
        "prefix_lm": (None, prefix, {}, {"prefix": 200}),
        "document_causal": (None, document_causal, {"doc_id": doc}, {}),
    }


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["noop", "causal", "alibi", "alibi_causal", "softcap",
                                  "softcap_causal", "sliding_window", "prefix_lm",
                                  "document_causal"])
@pytest.mark.parametrize("shape", [(2, 4, 2, 512, 64), (1, 4, 4, 300, 128)])
def test_forward_matches_torch_flex_attention(name, dtype, shape):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, Hq, Hkv, Sq, D = shape
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, Hq, Sq, D, device=dev, generator=g).to(dtype)
    k = torch.randn(B, Hkv, Sq, D, device=dev, generator=g).to(dtype)
    v = torch.randn(B, Hkv, Sq, D, device=dev, generator=g).to(dtype)
    smod, mmod, buffers, params = torch_mods(Hq, Sq, dev)[name]

    # fp64 reference: torch's flex_attention in eager mode (its math path) in double.
    bm64 = create_block_mask(mmod, 1, 1, Sq, Sq, device=dev) if mmod else None
    ref, ref_lse = flex_attention(q.double(), k.double(), v.double(), score_mod=smod,
                                  block_mask=bm64, enable_gqa=Hq != Hkv, return_lse=True)

    fj_mask = flexjit.create_block_mask(name, 1, 1, Sq, Sq, device=dev, buffers=buffers,
                                        params=params) if mmod else None
    out, lse = flexjit.flex_attention(q, k, v, score_mod=flexjit.standard_mods(name),
                                      block_mask=fj_mask, buffers=buffers, params=params,
                                      return_lse=True)
    torch.cuda.synchronize()
    assert out.dtype == dtype and out.shape == (B, Hq, Sq, D)
    assert torch.isfinite(out).all()
    err = rel(out, ref)
    lse_err = ((lse.double() - ref_lse).abs() / ref_lse.abs().clamp_min(1.0)).max().item()

    print(f"{name} {dtype} {shape}: flexjit rel {err:.2e}, lse {lse_err:.2e}")
    assert err <= TOL[dtype]
    assert lse_err <= 1e-2
    if dtype == torch.bfloat16 and Sq == 512:
        # torch's compiled kernel on the same inputs (one compile per mod keeps this short)
        t_out = torch.compile(flex_attention)(q, k, v, score_mod=smod, block_mask=bm64,
                                              enable_gqa=Hq != Hkv)
        print(f"  torch.compile(flex_attention) rel {rel(t_out, ref):.2e}")
        assert rel(out, t_out.double()) <= 2 * TOL[dtype]


@cuda
def test_custom_op_under_torch_compile_matches_eager():
    q = torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16)

    def f(q):
        return fjt.flex_attention(q, q, q, score_mod="softcap", mask_mod="causal") * 2

    eager = f(q)
    compiled = torch.compile(f, fullgraph=True)(q)
    torch.cuda.synchronize()
    assert rel(compiled, eager.double()) < 1e-3


@cuda
@pytest.mark.parametrize("sq", [1, 4, 40])
def test_paged_kv_cache_on_the_gpu_matches_the_cpu_backend(sq):
    """flexjit.flex_attention(seq_lens=, page_table=) on CUDA tensors (the decode kernels for
    up to 16 queries, the forward on the cache for 40) against the CPU backend on the same cache
    in fp32: 16-key pages of a shuffled pool, ragged lengths (one empty), queries at the end of
    each sequence."""
    gen = torch.Generator().manual_seed(sq)
    B, Hq, Hkv, D, ps, max_pages = 3, 8, 2, 64, 16, 5
    lens = torch.tensor([70, 0, 33], dtype=torch.int32)
    num_pages = B * max_pages
    table = torch.randperm(num_pages, generator=gen).to(torch.int32).reshape(B, max_pages)
    q = torch.randn(B, Hq, sq, D, generator=gen).to(torch.bfloat16)
    k_pool = torch.randn(num_pages, ps, Hkv, D, generator=gen).to(torch.bfloat16)
    v_pool = torch.randn(num_pages, ps, Hkv, D, generator=gen).to(torch.bfloat16)
    q_pos = torch.clamp(lens - sq, min=0).to(torch.int32)
    mods = "buffer q_pos: i32[B]\nmask_mod = q_idx + q_pos[b] >= kv_idx"
    ref, ref_lse = flexjit.flex_attention(q, k_pool, v_pool, mask_mod=mods,
                                          buffers={"q_pos": q_pos}, seq_lens=lens,
                                          page_table=table, return_lse=True)
    out, lse = flexjit.flex_attention(q.cuda(), k_pool.cuda(), v_pool.cuda(), mask_mod=mods,
                                      buffers={"q_pos": q_pos.cuda()}, seq_lens=lens.cuda(),
                                      page_table=table.cuda(), return_lse=True)
    torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and out.shape == (B, Hq, sq, D)
    assert torch.isfinite(out).all()
    assert rel(out.cpu(), ref.double()) <= TOL[torch.bfloat16]
    assert torch.equal(torch.isneginf(lse.cpu()), torch.isneginf(ref_lse))  # sequence 1 is empty
    finite = torch.isfinite(ref_lse)
    assert torch.allclose(lse.cpu()[finite], ref_lse[finite], rtol=1e-2, atol=1e-2)


@cuda
def test_gpu_errors_are_flexjit_exceptions():
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(flexjit.RuntimeError, match="slopes"):
        flexjit.flex_attention(q, q, q, score_mod="alibi")
    # Any multiple of 8 up to 256 runs (docs/kernels/README.md "Head dims"); 20 is not one.
    with pytest.raises(flexjit.UnsupportedError, match="multiples of 8"):
        x = torch.randn(1, 2, 64, 20, device="cuda", dtype=torch.bfloat16)
        flexjit.flex_attention(x, x, x)


TOL_BWD = {torch.bfloat16: 2e-2, torch.float16: 5e-3}  # tests/gpu/test_backward.cpp's rule


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["noop", "causal", "alibi_causal", "softcap_causal",
                                  "sliding_window", "document_causal"])
@pytest.mark.parametrize("shape", [(2, 4, 2, 512, 64), (1, 4, 4, 300, 128)])
def test_backward_matches_a_dense_fp64_reference(name, dtype, shape):
    """Autograd through torch.ops.flexjit.flex_attention against the same attention in fp64
    torch ops on the same (rounded) inputs, fresh random every run; the loss uses out and lse.
    For bf16 at S = 512, torch.nn.attention.flex_attention's compiled backward runs beside it
    (its error printed; flexjit's gradients within twice the rule of torch's)."""
    B, Hq, Hkv, S, D = shape
    dev = "cuda"
    seed = torch.seed()
    q = torch.randn(B, Hq, S, D, device=dev).to(dtype).requires_grad_(True)
    k = torch.randn(B, Hkv, S, D, device=dev).to(dtype).requires_grad_(True)
    v = torch.randn(B, Hkv, S, D, device=dev).to(dtype).requires_grad_(True)
    dout = torch.randn(B, Hq, S, D, device=dev).to(dtype)
    dlse = torch.randn(B, Hq, S, device=dev)
    smod, mmod, buffers, params = torch_mods(Hq, S, dev)[name]
    torch_smod = smod
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    if "slopes" in buffers:
        slopes = buffers["slopes"].clone().requires_grad_(True)
        buffers = {"slopes": slopes}
        s64 = slopes.detach().double().requires_grad_(True)
        leaves.append(s64)
        smod = lambda s, b, h, qi, kv: s + s64[h] * (kv - qi)  # noqa: E731

    out, lse = fjt.flex_attention(q, k, v, enable_gqa=True, score_mod=flexjit.standard_mods(name),
                                  buffers=buffers, params=params, return_lse=True)
    ((out.float() * dout.float()).sum() + (lse * dlse).sum()).backward()
    ref, ref_lse = dense_attention(*leaves[:3], score_mod=smod, mask_mod=mmod)
    ((ref * dout.double()).sum() + (ref_lse * dlse.double()).sum()).backward()
    torch.cuda.synchronize()

    line = f"{name} {dtype} {shape} (seed {seed}):"
    grads = [("dq", q, leaves[0]), ("dk", k, leaves[1]), ("dv", v, leaves[2])]
    if "slopes" in buffers:
        grads.append(("dslopes", buffers["slopes"], leaves[3]))
    for gname, t, r in grads:
        assert t.grad is not None and t.grad.dtype == t.dtype, gname
        assert torch.isfinite(t.grad).all(), gname
        err = rel_floor(t.grad, r.grad)
        line += f" {gname} {err:.2e}"
        assert err <= TOL_BWD[dtype], line
    print(line)
    if dtype == torch.bfloat16 and S == 512:
        # torch's compiled flex_attention backward on the same inputs, dout and dlse (one
        # compile per mod keeps this short): its error beside ours, and the two agree.
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        tq, tk, tv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        bm = create_block_mask(mmod, 1, 1, S, S, device=dev) if mmod else None
        t_out, t_lse = torch.compile(flex_attention)(tq, tk, tv, score_mod=torch_smod,
                                                     block_mask=bm, enable_gqa=Hq != Hkv,
                                                     return_lse=True)
        ((t_out.float() * dout.float()).sum() + (t_lse * dlse).sum()).backward()
        torch.cuda.synchronize()
        tline = "  torch.compile(flex_attention) backward:"
        for gname, t, ours, r in (("dq", tq, q, leaves[0]), ("dk", tk, k, leaves[1]),
                                  ("dv", tv, v, leaves[2])):
            tline += f" {gname} {rel_floor(t.grad, r.grad):.2e}"
            assert rel_floor(ours.grad, t.grad.double()) <= 2 * TOL_BWD[dtype], (gname, tline)
        print(tline)


@cuda
def test_deterministic_buffer_gradients_are_bitwise_repeatable():
    """flexjit.flex_attention_backward(deterministic=True) on the GPU: three runs give the same
    bits for every gradient (a relative-bias table: a per-element gradient site)."""
    dev, S = "cuda", 384
    q, k, v = (torch.randn(1, 2, S, 64, device=dev, dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(2 * S, device=dev)
    kw = dict(score_mod="relative_bias", buffers={"bias": bias}, params={"offset": S})
    out, lse = flexjit.flex_attention(q, k, v, return_lse=True, **kw)
    dout = torch.randn_like(out)
    runs = [flexjit.flex_attention_backward(q, k, v, out, lse, dout, deterministic=True, **kw)
            for _ in range(3)]
    torch.cuda.synchronize()
    for dq, dk, dv, grads in runs[1:]:
        for a, b in zip((dq, dk, dv, grads["bias"]), (runs[0][0], runs[0][1], runs[0][2],
                                                     runs[0][3]["bias"])):
            assert torch.equal(a, b)
    assert torch.isfinite(runs[0][3]["bias"]).all() and runs[0][3]["bias"].abs().sum() > 0


@cuda
def test_custom_op_deterministic_backward_is_bitwise_repeatable():
    """flexjit.torch.flex_attention(deterministic=True): autograd's buffer gradient (and dq, dk,
    dv) have the same bits in three runs, and agree with the default (atomic) backward."""
    S = 384
    q0, k0, v0 = (torch.randn(1, 2, S, 64, device="cuda", dtype=torch.bfloat16)
                  for _ in range(3))
    bias0 = torch.randn(2 * S, device="cuda")
    dout = torch.randn(1, 2, S, 64, device="cuda", dtype=torch.bfloat16)

    def grads(deterministic):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        bias = bias0.clone().requires_grad_()
        out = fjt.flex_attention(q, k, v, enable_gqa=True, score_mod="relative_bias", mask_mod="causal",
                                 buffers={"bias": bias}, params={"offset": S},
                                 deterministic=deterministic)
        (out.float() * dout.float()).sum().backward()
        return q.grad, k.grad, v.grad, bias.grad

    runs = [grads(True) for _ in range(3)]
    atomic = grads(False)
    torch.cuda.synchronize()
    for run in runs[1:]:
        for a, b in zip(run, runs[0]):
            assert torch.equal(a, b)
    for a, b in zip(runs[0], atomic):
        assert torch.isfinite(a).all()
        assert rel(a, b.double()) <= 1e-2


@cuda
def test_backward_under_torch_compile_matches_eager():
    q = torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def f(q):
        out = fjt.flex_attention(q, q, q, score_mod="softcap", mask_mod="causal")
        return out.float().square().sum()

    f(q).backward()
    eager = q.grad.clone()
    q.grad = None
    torch.compile(f, fullgraph=True)(q).backward()
    torch.cuda.synchronize()
    # Both against fp64 torch ops with the bf16 rule. Eager and compiled may round the output
    # gradient 2·out to bf16 at different points (Inductor fuses the cast), so they agree to
    # about one bf16 ulp, not bit for bit (measured 2.1e-3 relative on an H100).
    x = q.detach().double().requires_grad_(True)
    ref, _ = dense_attention(x, x, x, score_mod=lambda s, b, h, qi, kv: 30.0 * torch.tanh(s / 30.0),
                             mask_mod=lambda b, h, qi, kv: qi >= kv)
    ref.square().sum().backward()
    assert rel_floor(eager, x.grad) <= 2e-2
    assert rel_floor(q.grad, x.grad) <= 2e-2
    assert rel(q.grad, eager.double()) < 1e-2
