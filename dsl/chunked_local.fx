// chunked_local: causal attention inside fixed chunks of `chunk` positions (Llama 4 style).
param chunk: i32 = 1024
mask_mod = q_idx / chunk == kv_idx / chunk && q_idx >= kv_idx
