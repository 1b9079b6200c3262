import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
q, k, v = [torch.randn(8, 16, 2048, 64, device='cuda', dtype=torch.bfloat16) for _ in range(3)]
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for causal in (False, True):
        for _ in range(2):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
