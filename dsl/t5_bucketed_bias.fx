// t5_bucketed_bias: T5 relative-position bias, a learned scalar per (head, bucket).
// The bucket of rel = kv_idx - q_idx is T5's bidirectional bucketing with 32 buckets and
// max_distance 128 (HF transformers T5Attention._relative_position_bucket, bidirectional=True):
//   n      = |rel|
//   bucket = (rel > 0 ? 16 : 0)                                  half the buckets per direction
//          + (n < 8 ? n                                          8 exact buckets for small n
//                   : min(8 + floor(log(n / 8) / log(128 / 8) * 8), 15))   8 log-spaced buckets
// log(128 / 8) = log(16) is written as the f32 literal 2.7725887, the value PyTorch uses when it
// divides an f32 tensor by the Python float math.log(16). For n < 8 the log branch is not taken
// (log(0) = -inf there, which int() saturates harmlessly).
buffer bias: f32[H, 32]
let rel = kv_idx - q_idx
let n = abs(rel)
let large = min(8 + int(floor(log(float(n) / 8.0) / 2.7725887 * 8.0)), 15)
let bucket = where(rel > 0, 16, 0) + where(n < 8, n, large)
score_mod = score + bias[h, bucket]
