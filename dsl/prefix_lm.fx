// prefix_lm: every query sees the whole prefix (kv_idx <= prefix) and the causal past.
param prefix: i32 = 1024
mask_mod = kv_idx <= prefix || q_idx >= kv_idx
