// dilated_sliding: causal sliding window that keeps every `dilation`-th key in the window.
param window: i32 = 1024
param dilation: i32 = 2
mask_mod = q_idx >= kv_idx && q_idx - kv_idx <= window && (q_idx - kv_idx) % dilation == 0
