// relative_bias: a learned bias per relative position, bias[q_idx - kv_idx + offset].
// bias has R >= 2 * offset entries; PyTorch's reference uses R = 2 * S and offset = S.
buffer bias: f32[R]
param offset: i32 = 4096
score_mod = score + bias[q_idx - kv_idx + offset]
