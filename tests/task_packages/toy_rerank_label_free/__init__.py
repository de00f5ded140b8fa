"""The toy reranker able to retrofit: its spec and face, a label-free training entry (a teacher, a
retrofit recipe builder). Listed instead of ``toy_rerank``, never beside it (one task, one entry)."""
