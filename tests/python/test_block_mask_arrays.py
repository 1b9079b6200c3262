"""Block masks from a framework's arrays (flexjit._flexjit._block_mask_from_arrays), their
views(), the calls' `config` dict and the DLPack dtype errors that name the argument.

The CPU tests use NumPy. The GPU tests need PyTorch and a GPU (skipped otherwise, with the reason
printed by `pytest -rs`): a mask from create_block_mask(device="cuda") -> views() ->
torch.from_dlpack -> _block_mask_from_arrays gives the same attention (bitwise: the same tiles and
kernel), fresh random inputs checked against an fp64 reference too."""
import gc
import re

import numpy as np
import pytest

import flexjit
from flexjit import _flexjit as C

from reference import attention_f64, causal, rel_error

NAMES = ["kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
         "q_indices", "full_q_num_blocks", "full_q_indices"]


def from_arrays(arrays, seqlen_q, seqlen_kv, block=128, mods=None, validate=False, **given):
    """_block_mask_from_arrays with the 8 arrays from a dict (missing keys: None)."""
    arrays = dict(arrays, **given)
    return C._block_mask_from_arrays(*[arrays.get(n) for n in NAMES], seqlen_q, seqlen_kv, block,
                                     block, mods if mods is not None else flexjit.Mods(),
                                     validate)


def window_mask(window):
    return f"param window: i32 = {window}\nmask_mod = q_idx >= kv_idx && q_idx - kv_idx <= window"


# --- CPU: NumPy arrays ---------------------------------------------------------------------


def test_from_arrays_round_trips_a_cpu_mask():
    bm = flexjit.create_block_mask(window_mask(300), 2, 3, 1000, 900)
    views = bm.views()
    assert sorted(views) == sorted(NAMES)
    for name, a in views.items():
        assert a.dtype == np.int32 and a.flags.c_contiguous, name
    assert views["kv_indices"].shape == (2, 3, 8, 8)
    assert views["q_num_blocks"].shape == (2, 3, 8)

    same = from_arrays(views, 1000, 900, mods=bm.mods)
    assert same.device == "cpu" and same.shape == bm.shape and same.block_size == (128, 128)
    assert same.density() == bm.density()
    for name, a in same.views().items():
        np.testing.assert_array_equal(a, views[name], err_msg=name)
    for name, a in same.arrays().items():
        np.testing.assert_array_equal(a, bm.arrays()[name], err_msg=name)

    # Without q_* / full_q_*: computed from kv_* (the same transposition).
    kv_only = {n: views[n] for n in NAMES[:4]}
    computed = from_arrays(kv_only, 1000, 900, mods=bm.mods)
    for name, a in computed.views().items():
        np.testing.assert_array_equal(a, views[name], err_msg=name)

    # views() of a CPU mask are copies: writing one changes nothing.
    views["kv_num_blocks"][:] = 0
    assert same.density() == bm.density()


def test_a_cpu_mask_from_arrays_supplies_its_mask_mod_to_attention():
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 2, 200, 16), dtype=np.float32) for _ in range(3))
    bm = flexjit.create_block_mask("causal", 1, 1, 200, 200, BLOCK_SIZE=64)
    mine = from_arrays(bm.views(), 200, 200, block=64, mods=bm.mods)
    got = flexjit.flex_attention(q, k, v, block_mask=mine)
    np.testing.assert_array_equal(got, flexjit.flex_attention(q, k, v, block_mask=bm))
    assert rel_error(got, attention_f64(q, k, v, mask_mod=causal)[0]) < 1e-5


def test_hand_written_arrays_without_full_tiles():
    # Sq = Skv = 256 in 128 tiles: q tile 0 sees key tile 0, q tile 1 sees 0 and 1 (all partial).
    kv_num = np.array([[[1, 2]]], dtype=np.int32)
    kv_idx = np.array([[[[0, 1], [0, 1]]]], dtype=np.int32)
    bm = from_arrays({"kv_num_blocks": kv_num, "kv_indices": kv_idx}, 256, 256)
    views = bm.views()
    np.testing.assert_array_equal(views["full_kv_num_blocks"], np.zeros((1, 1, 2), np.int32))
    np.testing.assert_array_equal(views["q_num_blocks"], [[[2, 1]]])
    np.testing.assert_array_equal(views["q_indices"], [[[[0, 1], [1, 0]]]])
    assert bm.density() == 0.75
    assert "░░" in bm.to_string() and "░·" in bm.to_string()


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(kv_indices=a["kv_indices"][..., :7].copy()),
     "kv_indices has shape [1, 1, 8, 7]; expected [Bm, Hm, 8, 8] (Bm, Hm = 1, 1 from "
     "kv_num_blocks; 8 x 8 tiles of 128 x 128 for seqlen_q 1000, seqlen_kv 1000)"),
    (lambda a: a.update(q_indices=np.zeros((2, 1, 8, 8), np.int32)),
     "q_indices has shape [2, 1, 8, 8]; expected [Bm, Hm, 8, 8] (Bm, Hm = 1, 1 from"),
    (lambda a: a.update(kv_num_blocks=a["kv_num_blocks"][:, :, :7].copy()),
     "kv_num_blocks has shape [1, 1, 7]; expected [Bm, Hm, 8] with Bm, Hm >= 1"),
    (lambda a: a.update(kv_indices=a["kv_indices"].astype(np.int64)),
     "kv_indices has dtype int64; flexjit takes int32 for kv_indices"),
    (lambda a: a.update(full_kv_indices=a["full_kv_indices"].astype(np.float32)),
     "full_kv_indices has dtype float32; flexjit takes int32 for full_kv_indices"),
    (lambda a: a.update(kv_indices=np.asfortranarray(a["kv_indices"])),
     "kv_indices is not C-contiguous (shape [1, 1, 8, 8]"),
    (lambda a: a.update(q_indices=None),
     "q_num_blocks is given but q_indices is not; give both or neither"),
    (lambda a: a.update(full_kv_num_blocks=None, full_kv_indices=None),
     "full_q_num_blocks / full_q_indices are given without full_kv_num_blocks"),
    (lambda a: a.update(kv_num_blocks=None, kv_indices=None),
     "a block mask needs kv_num_blocks and kv_indices"),
])
def test_from_arrays_names_the_bad_array(change, message):
    arrays = flexjit.create_block_mask("causal", 1, 1, 1000, 1000).views()
    change(arrays)
    with pytest.raises(flexjit.RuntimeError, match="^" + re.escape(message)):
        from_arrays(arrays, 1000, 1000)


@pytest.mark.parametrize("name, index, value, message", [
    ("kv_indices", (0, 0, 3, 0), 9, r"kv_indices\[0, 0, 3, 0\] = 9 is out of range \[0, 8\)"),
    ("kv_num_blocks", (0, 0, 2), 9, r"kv_num_blocks\[0, 0, 2\] = 9 is outside \[0, 8\]"),
    # q tile 5 has full tiles 0-4 and partial tile 5: one more full tile counts 5 twice.
    ("full_kv_num_blocks", (0, 0, 5), 6,
     r"KV tile 5 of Q tile 5 \(row 5\) is both partial and full"),
    ("q_num_blocks", (0, 0, 0), 0, r"q_num_blocks / full_q_num_blocks are not the transpose"),
])
def test_cpu_arrays_are_always_validated(name, index, value, message):
    arrays = flexjit.create_block_mask("causal", 1, 1, 1000, 1000).views()
    arrays[name][index] = value
    with pytest.raises(flexjit.RuntimeError, match=message):
        from_arrays(arrays, 1000, 1000)


# --- config --------------------------------------------------------------------------------


def _qkv(seed=None, shape=(1, 2, 64, 16)):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape, dtype=np.float32) for _ in range(3))


def test_a_valid_config_is_accepted_and_the_cpu_result_unchanged():
    q, k, v = _qkv()
    want = flexjit.flex_attention(q, k, v, mask_mod="causal")
    config = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2, "num_splits": 0,
              "q_tiles": None, "persistent": -1, "variant": "sm80_mma", "autotune": "off",
              "math": "exact"}
    np.testing.assert_array_equal(flexjit.flex_attention(q, k, v, mask_mod="causal",
                                                         config=config), want)
    out, lse = flexjit.flex_attention(q, k, v, return_lse=True)
    dout = np.ones_like(out)
    grads = flexjit.flex_attention_backward(q, k, v, out, lse, dout, config={
        "block_m": 64, "variant": "", "autotune": "cached", "math": "auto",
        "dq_mode": "second_pass"})
    for g, w in zip(grads[:3], flexjit.flex_attention_backward(q, k, v, out, lse, dout)[:3]):
        np.testing.assert_array_equal(g, w)


FORWARD_KEYS = ("block_m, block_n, num_warps, num_stages, q_tiles, persistent, num_splits, "
                "kv_copy, variant, autotune, math")
BACKWARD_KEYS = "block_m, block_n, num_warps, num_stages, variant, autotune, math, dq_mode"


@pytest.mark.parametrize("config, message", [
    ({"blockm": 64}, f"config key 'blockm' is unknown (did you mean 'block_m'?); the forward "
                     f"takes {FORWARD_KEYS}"),
    ({"BLOCK_M": 64}, "config key 'BLOCK_M' is unknown (did you mean 'block_m'?)"),
    ({"dq_mode": "atomic"}, f"config key 'dq_mode' applies to the backward only; the forward "
                            f"takes {FORWARD_KEYS}"),
    ({"block_m": "64"}, "config['block_m'] must be an int, not str ('64')"),
    ({"num_warps": 4.0}, "config['num_warps'] must be an int, not float (4.0)"),
    ({"num_stages": True}, "config['num_stages'] must be an int, not bool (True)"),
    ({"block_n": -32}, "config['block_n'] = -32 is out of range: 0 (the default) or a positive"),
    ({"persistent": 2}, "config['persistent'] = 2 is not 1 (persistent CTAs), -1 (one CTA per "
                        "query tile) or 0 (the default)"),
    ({"math": "fast"}, "config['math'] = 'fast' is not one of auto, exact, approx"),
    ({"autotune": "on"}, "config['autotune'] = 'on' is not one of off, cached, search"),
    ({"variant": 3}, "config['variant'] must be a kernel variant's name (a str), not 3"),
])
def test_forward_config_errors_name_the_key_and_what_is_known(config, message):
    q, k, v = _qkv()
    with pytest.raises(flexjit.RuntimeError) as e:
        flexjit.flex_attention(q, k, v, config=config)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("config, message", [
    ({"q_tiles": 2}, f"config key 'q_tiles' applies to the forward only; the backward takes "
                     f"{BACKWARD_KEYS}"),
    ({"dq_mod": "atomic"}, "config key 'dq_mod' is unknown (did you mean 'dq_mode'?)"),
    ({"dq_mode": "atomics"}, "config['dq_mode'] = 'atomics' is not one of auto, second_pass, "
                             "atomic"),
])
def test_backward_config_errors(config, message):
    q, k, v = _qkv()
    out, lse = flexjit.flex_attention(q, k, v, return_lse=True)
    with pytest.raises(flexjit.RuntimeError) as e:
        flexjit.flex_attention_backward(q, k, v, out, lse, out, config=config)
    assert str(e.value).startswith(message)


# --- DLPack dtypes the arguments cannot take -----------------------------------------------


FLOATS = "float32, float16, bfloat16"
QKV_FLOATS = FLOATS + ", float8_e4m3fn"  # e4m3 q, k, v: the sm_90a forward (docs/attention.md)


@pytest.mark.parametrize("arg, dtype, message", [
    ("q", np.float64, f"q has dtype float64; flexjit takes {QKV_FLOATS} for q"),
    ("k", np.int64, f"k has dtype int64; flexjit takes {QKV_FLOATS} for k"),
    ("v", np.uint16, f"v has dtype uint16; flexjit takes {QKV_FLOATS} for v"),
    ("out", np.float64, f"out has dtype float64; flexjit takes {FLOATS} for out"),
    ("lse", np.float64, "lse has dtype float64; flexjit takes float32 for lse"),
])
def test_forward_dtype_errors_name_the_argument(arg, dtype, message):
    q, k, v = _qkv()
    args = {"q": q, "k": k, "v": v, "out": np.empty_like(q),
            "lse": np.empty(q.shape[:3], np.float32)}
    args[arg] = args[arg].astype(dtype)
    with pytest.raises(flexjit.RuntimeError, match="^" + re.escape(message) + "$"):
        C._flex_attention_into(args["q"], args["k"], args["v"], args["out"], args["lse"],
                               flexjit.Mods(), None, [], [], None, 0, 0)


def test_public_call_dtype_errors_name_the_argument():
    q, k, v = _qkv()
    with pytest.raises(flexjit.RuntimeError, match=r"^q has dtype float64; flexjit takes"):
        flexjit.flex_attention(q.astype(np.float64), k, v)
    with pytest.raises(flexjit.RuntimeError,
                       match=r"^buffer 'doc_id' has dtype int64; flexjit takes int32 for buffer "
                             r"'doc_id'$"):
        flexjit.flex_attention(q, k, v, mask_mod="document_causal",
                               buffers={"doc_id": np.zeros(64, np.int64)})
    with pytest.raises(flexjit.RuntimeError,
                       match=r"^buffer 'slopes' has dtype float64; flexjit takes float32 for"):
        flexjit.flex_attention(q, k, v, score_mod="alibi",
                               buffers={"slopes": np.ones(2, np.float64)})
    with pytest.raises(flexjit.RuntimeError,
                       match=r"^seq_lens has dtype int64; flexjit takes int32 for seq_lens$"):
        flexjit.flex_attention(q, k, v, seq_lens=np.full(1, 64, np.int64))
    with pytest.raises(flexjit.RuntimeError,
                       match=r"^page_table has dtype int64; flexjit takes int32 for page_table$"):
        flexjit.flex_attention(q, k, v, seq_lens=np.full(1, 64, np.int32),
                               page_table=np.zeros((1, 1), np.int64))
    with pytest.raises(flexjit.RuntimeError,
                       match=r"^kv_num_blocks has dtype int64; flexjit takes int32 for "
                             r"kv_num_blocks$"):
        from_arrays({"kv_num_blocks": np.zeros((1, 1, 1), np.int64),
                     "kv_indices": np.zeros((1, 1, 1, 1), np.int32)}, 64, 64)


@pytest.mark.parametrize("arg, message", [
    ("dout", f"dout has dtype float64; flexjit takes {FLOATS} for dout"),
    ("dlse", "dlse has dtype float64; flexjit takes float32 for dlse"),
    ("lse", "lse has dtype float64; flexjit takes float32 for lse"),
    ("dq", f"dq has dtype float64; flexjit takes {FLOATS} for dq"),
])
def test_backward_dtype_errors_name_the_argument(arg, message):
    q, k, v = _qkv()
    out, lse = flexjit.flex_attention(q, k, v, return_lse=True)
    args = {"out": out, "lse": lse, "dout": np.ones_like(out), "dlse": np.zeros_like(lse),
            "dq": np.empty_like(q)}
    args[arg] = args[arg].astype(np.float64)
    with pytest.raises(flexjit.RuntimeError, match="^" + re.escape(message) + "$"):
        C._flex_attention_backward_into(q, k, v, args["out"], args["lse"], args["dout"],
                                        args["dlse"], args["dq"], np.empty_like(k),
                                        np.empty_like(v), flexjit.Mods(), None, [], [], [], None,
                                        0, 0)


# --- GPU: PyTorch tensors ------------------------------------------------------------------


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("skipped: no GPU")
    return torch


def _imported(torch, views):
    """torch tensors of a mask's views (None stays None), each checked to share the memory."""
    out = {}
    for name, view in views.items():
        if view is None:
            out[name] = None
            continue
        t = torch.from_dlpack(view)
        assert t.is_cuda and t.dtype == torch.int32 and t.is_contiguous(), name
        out[name] = t
    return out


def _dense_ref(torch, q, k, v, allowed):
    """fp64 attention of q, k, v [B, H, S, D] under a boolean mask [S, S]."""
    s = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


def test_gpu_views_round_trip_through_torch_to_the_same_attention():
    torch = _torch_cuda()
    B, H, S, D = 2, 4, 1000, 64
    bm = flexjit.create_block_mask(window_mask(300), B, 1, S, S, device="cuda")
    views = bm.views()
    assert sorted(views) == sorted(NAMES)
    tensors = _imported(torch, views)
    assert tensors["kv_indices"].shape == (B, 1, 8, 8)
    # Zero-copy: the views are the mask's device memory, and so is a mask made from them.
    same = from_arrays(tensors, S, S, mods=bm.mods)
    assert same.device == "cuda:0"
    again = _imported(torch, same.views())
    for name in NAMES:
        assert again[name].data_ptr() == tensors[name].data_ptr(), name
    # Only kv_* and full_kv_*: q_* computed on the way (download, transpose, upload).
    computed = from_arrays({n: tensors[n] for n in NAMES[:4]}, S, S, mods=bm.mods, validate=True)
    for name, t in _imported(torch, computed.views()).items():
        assert torch.equal(t, tensors[name]), name

    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    want, want_lse = flexjit.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    for mask in (same, computed):
        out, lse = flexjit.flex_attention(q, k, v, block_mask=mask, return_lse=True)
        assert torch.equal(out, want) and torch.equal(lse, want_lse)
    idx = torch.arange(S, device="cuda")
    allowed = (idx[:, None] >= idx[None, :]) & (idx[:, None] - idx[None, :] <= 300)
    ref = _dense_ref(torch, q, k, v, allowed)
    assert ((want.double() - ref).norm() / ref.norm()).item() < 1e-2

    # The backward walks the q_* arrays: deterministic, so bitwise the original mask's.
    grads = flexjit.flex_attention_backward(q, k, v, want, want_lse, dout, block_mask=bm,
                                            deterministic=True)
    got = flexjit.flex_attention_backward(q, k, v, want, want_lse, dout, block_mask=computed,
                                          deterministic=True)
    for g, w in zip(got[:3], grads[:3]):
        assert torch.equal(g, w)


def test_gpu_views_keep_the_mask_alive():
    torch = _torch_cuda()
    bm = flexjit.create_block_mask("causal", 1, 2, 2048, 2048, device="cuda")
    kv_indices = torch.from_dlpack(bm.views()["kv_indices"])
    expected = kv_indices.clone()
    ptr = kv_indices.data_ptr()
    del bm
    gc.collect()
    # New masks (fresh device allocations) of the same sizes and other contents: had the first
    # mask's memory been freed, one of them would be given it and overwrite it.
    others = [flexjit.create_block_mask(window_mask(100 + i), 1, 2, 2048, 2048, device="cuda")
              for i in range(4)]
    torch.cuda.synchronize()
    assert kv_indices.data_ptr() == ptr
    assert torch.equal(kv_indices, expected)
    assert all(torch.from_dlpack(o.views()["kv_indices"]).data_ptr() != ptr for o in others)


def test_gpu_a_borrowed_mask_keeps_its_tensors_alive_and_follows_arrays_changed():
    torch = _torch_cuda()
    S, D = 900, 64
    causal = flexjit.create_block_mask("causal", 1, 1, S, S, device="cuda")
    window = flexjit.create_block_mask(window_mask(200), 1, 1, S, S, device="cuda")
    tensors = {n: t.clone() for n, t in _imported(torch, causal.views()).items()}
    mask = from_arrays(tensors, S, S)  # no mods: the calls give the mask_mod
    owned = {n: t.data_ptr() for n, t in tensors.items()}
    del tensors
    gc.collect()
    torch.cuda.empty_cache()
    # Had the clones been freed, torch would hand their blocks out again: fill them with junk.
    junk = [torch.full((1, 1, 8, 8), 77, dtype=torch.int32, device="cuda") for _ in range(64)]
    q = torch.randn(1, 4, S, D, device="cuda", dtype=torch.bfloat16)
    want = flexjit.flex_attention(q, q, q, mask_mod="causal", block_mask=causal)
    assert torch.equal(flexjit.flex_attention(q, q, q, mask_mod="causal", block_mask=mask), want)
    assert all(j.data_ptr() not in owned.values() for j in junk)

    # Rewritten in place through views() (the same memory as the tensors it was made from).
    mine = _imported(torch, mask.views())
    for name, t in _imported(torch, window.views()).items():
        mine[name].copy_(t)
    mask.arrays_changed()
    got = flexjit.flex_attention(q, q, q, mask_mod=window_mask(200), block_mask=mask)
    assert torch.equal(got, flexjit.flex_attention(q, q, q, mask_mod=window_mask(200),
                                                   block_mask=window))
    idx = torch.arange(S, device="cuda")
    allowed = (idx[:, None] >= idx[None, :]) & (idx[:, None] - idx[None, :] <= 200)
    ref = _dense_ref(torch, q, q, q, allowed)
    assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_gpu_from_arrays_errors():
    torch = _torch_cuda()
    tensors = _imported(torch, flexjit.create_block_mask("causal", 1, 1, 512, 512,
                                                         device="cuda").views())
    with pytest.raises(flexjit.RuntimeError,
                       match=r"^q_indices is on cpu but kv_num_blocks is on cuda:0"):
        from_arrays(dict(tensors, q_indices=tensors["q_indices"].cpu()), 512, 512)
    with pytest.raises(flexjit.RuntimeError,
                       match=r"^kv_indices has dtype int64; flexjit takes int32 for kv_indices$"):
        from_arrays(dict(tensors, kv_indices=tensors["kv_indices"].long()), 512, 512)
    with pytest.raises(flexjit.RuntimeError, match=r"^kv_indices is not C-contiguous"):
        from_arrays(dict(tensors, kv_indices=tensors["kv_indices"].transpose(2, 3)), 512, 512)
    bad = {n: t.clone() for n, t in tensors.items()}
    bad["kv_indices"][0, 0, 3, 0] = 4
    from_arrays(bad, 512, 512)  # contents are not checked by default (no download)
    with pytest.raises(flexjit.RuntimeError, match=r"kv_indices\[0, 0, 3, 0\] = 4 is out of"):
        from_arrays(bad, 512, 512, validate=True)
    with pytest.raises(flexjit.RuntimeError, match=r"kv_indices\[0, 0, 3, 0\] = 4 is out of"):
        from_arrays({n: bad[n] for n in NAMES[:4]}, 512, 512)  # q_* computed: checked first
    q = torch.randn(1, 1, 512, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(flexjit.RuntimeError, match=r"^q has dtype float64; flexjit takes"):
        flexjit.flex_attention(q.double(), q, q)
