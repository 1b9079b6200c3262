// alibi: ALiBi linear position bias, one slope per query head (Press et al. 2022).
// PyTorch's reference slopes are exp2(-8 * (h + 1) / H).
buffer slopes: f32[H]
score_mod = score + slopes[h] * (kv_idx - q_idx)
