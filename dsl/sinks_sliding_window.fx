// sinks_sliding_window: GPT-OSS's sliding-window layers: causal attention over the last
// `window` positions (window + 1 keys) with a learnable attention sink per query head.
param window: i32 = 127
buffer sinks: f32[H]
mask_mod = q_idx >= kv_idx && q_idx - kv_idx <= window
sink_mod = sinks[h]
