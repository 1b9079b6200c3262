// document_causal: packed sequences, causal within each document.
buffer doc_id: i32[S]
mask_mod = doc_id[q_idx] == doc_id[kv_idx] && q_idx >= kv_idx
