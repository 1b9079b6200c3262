// softcap_causal: tanh soft-capping of the logits with a causal mask.
param cap: f32 = 30.0
score_mod = cap * tanh(score / cap)
mask_mod = q_idx >= kv_idx
