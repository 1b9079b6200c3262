// alibi_causal: ALiBi position bias with a causal mask.
buffer slopes: f32[H]
score_mod = score + slopes[h] * (kv_idx - q_idx)
mask_mod = q_idx >= kv_idx
