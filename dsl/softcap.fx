// softcap: tanh soft-capping of the logits (Gemma 2, Grok): cap * tanh(score / cap).
param cap: f32 = 30.0
score_mod = cap * tanh(score / cap)
