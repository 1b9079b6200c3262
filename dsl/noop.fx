// noop: the identity score_mod; plain softmax attention.
score_mod = score
