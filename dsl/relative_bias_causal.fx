// relative_bias_causal: a learned relative-position bias with a causal mask.
buffer bias: f32[R]
param offset: i32 = 4096
score_mod = score + bias[q_idx - kv_idx + offset]
mask_mod = q_idx >= kv_idx
