// sinks: a learnable attention sink per query head (GPT-OSS; StreamingLLM's sink token): an
// extra logit in each row's softmax denominator that carries no value, in the units of the
// scores after scale (lse includes it). Bind `sinks` to the Hq logits.
buffer sinks: f32[H]
sink_mod = sinks[h]
