// document: packed sequences; a query attends only within its own document.
// doc_id[i] is the document of position i (bidirectional within a document).
buffer doc_id: i32[S]
mask_mod = doc_id[q_idx] == doc_id[kv_idx]
