"""flexjit with PyTorch: the framework round trip on the CPU, and on a GPU the forward against
torch.nn.attention.flex_attention on the standard mods, with the C++ suite's error rules
(tests/gpu/test_forward.cpp): relative Frobenius error vs an fp64 reference <= 1e-2 (bf16),
3e-3 (f16); lse max relative error <= 1e-2; no non-finite values. Skipped without PyTorch
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
                          (q, q, q, "mask_mod = q_idx >= kv_idx", [], [], [], [], None, True),
                          test_utils=("test_schema", "test_faketensor"))


def test_backward_raises_a_clear_error():
    q = torch.randn(1, 2, 16, 16, requires_grad=True)
    out = fjt.flex_attention(q, q, q)
    with pytest.raises(RuntimeError, match="no backward yet"):
        out.sum().backward()


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
def test_gpu_errors_are_flexjit_exceptions():
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(flexjit.RuntimeError, match="slopes"):
        flexjit.flex_attention(q, q, q, score_mod="alibi")
    with pytest.raises(flexjit.UnsupportedError):
        x = torch.randn(1, 2, 64, 24, device="cuda", dtype=torch.bfloat16)
        flexjit.flex_attention(x, x, x)
