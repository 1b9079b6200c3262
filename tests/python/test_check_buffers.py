# check_buffers from Python (issue 34: buffer indices computed from data): the keyword and the
# config key on the CPU backend with NumPy (an index past a buffer's end is a flexjit.RuntimeError
# naming the buffer, index, extent, load and position; valid data gives the unchecked answer),
# flexjit.torch's kernel_options key, and the same on a GPU (skipped without torch or CUDA).
import numpy as np
import pytest

import flexjit

DOC_BIAS = ("buffer doc_id: i32[S]\nbuffer doc_bias: f32[N]\n"
            "score_mod = score + doc_bias[doc_id[q_idx]]")
MESSAGE = (r"buffer 'doc_bias': index 7 is out of bounds for dim 0 of extent 4 "
           r"\(at doc_bias\[7\]\): the score_mod's load doc_bias\[doc_id\[q_idx\]\] at b=0, "
           r"h=0, q_idx=37")


def _inputs(seed=0, B=1, H=2, S=64, D=16):
    rng = np.random.default_rng(seed)
    q, k, v, dout = (rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(4))
    doc = (np.arange(S) * 4 // S).astype(np.int32)  # four documents: every id indexes bias
    bias = rng.uniform(-1.0, 1.0, 4).astype(np.float32)
    return q, k, v, dout, doc, bias


def test_check_buffers_on_the_cpu_names_the_first_out_of_bounds_load():
    q, k, v, dout, doc, bias = _inputs()
    buffers = {"doc_id": doc, "doc_bias": bias}
    plain = flexjit.flex_attention(q, k, v, score_mod=DOC_BIAS, buffers=buffers)
    checked = flexjit.flex_attention(q, k, v, score_mod=DOC_BIAS, buffers=buffers,
                                     check_buffers=True)
    np.testing.assert_array_equal(checked, plain)
    doc[37] = 7
    # Unchecked, the CPU backend clamps the load: an answer, silently different.
    flexjit.flex_attention(q, k, v, score_mod=DOC_BIAS, buffers=buffers)
    with pytest.raises(flexjit.RuntimeError, match=MESSAGE):
        flexjit.flex_attention(q, k, v, score_mod=DOC_BIAS, buffers=buffers, check_buffers=True)
    with pytest.raises(flexjit.RuntimeError, match=MESSAGE):
        flexjit.flex_attention(q, k, v, score_mod=DOC_BIAS, buffers=buffers,
                               config={"check_buffers": True})
    # The backward checks too.
    doc[37] = 2
    out, lse = flexjit.flex_attention(q, k, v, score_mod=DOC_BIAS, buffers=buffers,
                                      return_lse=True)
    doc[37] = 7
    with pytest.raises(flexjit.RuntimeError, match=MESSAGE):
        flexjit.flex_attention_backward(q, k, v, out, lse, dout, score_mod=DOC_BIAS,
                                        buffers=buffers, check_buffers=True)


def test_check_buffers_config_value_must_be_a_bool():
    q, k, v, _, doc, bias = _inputs()
    with pytest.raises(flexjit.RuntimeError,
                       match=r"config\['check_buffers'\] must be True or False, not 'yes'"):
        flexjit.flex_attention(q, k, v, score_mod=DOC_BIAS,
                               buffers={"doc_id": doc, "doc_bias": bias},
                               config={"check_buffers": "yes"})


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_check_buffers_through_torch(device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import flexjit.torch as fjt

    q, k, v, _, doc, bias = _inputs(3, S=96, D=64)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    tq, tk, tv = (torch.from_numpy(x).to(device, dtype) for x in (q, k, v))
    tdoc = torch.from_numpy(doc).to(device)
    tbias = torch.from_numpy(bias).to(device)
    buffers = {"doc_id": tdoc, "doc_bias": tbias}
    plain = fjt.flex_attention(tq, tk, tv, score_mod=DOC_BIAS, buffers=buffers)
    checked = fjt.flex_attention(tq, tk, tv, score_mod=DOC_BIAS, buffers=buffers,
                                 kernel_options={"check_buffers": True})
    # The CPU backend runs the same kernels after its check; on a GPU the checked kernels differ
    # around their loads (a last-bit difference before the bf16 rounding is possible).
    tol = {"rtol": 0, "atol": 0} if device == "cpu" else {}
    torch.testing.assert_close(checked, plain, **tol)
    # The same through flexjit's own function on the torch tensors.
    direct = flexjit.flex_attention(tq, tk, tv, score_mod=DOC_BIAS, buffers=buffers,
                                    check_buffers=True)
    torch.testing.assert_close(direct, plain, **tol)
    tdoc[37] = 7
    # On a GPU any row of the call may be the one recorded first: only row 37 is bad.
    message = (r"buffer 'doc_bias': index 7 is out of bounds for dim 0 of extent 4 "
               r"\(at doc_bias\[7\]\): the score_mod's load doc_bias\[doc_id\[q_idx\]\] at "
               r"b=0, h=\d, q_idx=37")
    with pytest.raises(flexjit.RuntimeError, match=message):
        fjt.flex_attention(tq, tk, tv, score_mod=DOC_BIAS, buffers=buffers,
                           kernel_options={"check_buffers": True})
    with pytest.raises(flexjit.RuntimeError, match=message):
        flexjit.flex_attention(tq, tk, tv, score_mod=DOC_BIAS, buffers=buffers,
                               check_buffers=True)
