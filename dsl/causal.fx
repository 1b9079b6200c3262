// causal: each query attends to itself and to earlier positions.
mask_mod = q_idx >= kv_idx
