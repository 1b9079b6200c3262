// sliding_window: causal attention over the last `window` positions (window + 1 keys).
param window: i32 = 1024
mask_mod = q_idx >= kv_idx && q_idx - kv_idx <= window
