"""The reranker-shaped toy task: a query and passages in, a score per passage out
(tests/test_toy_reranker.py)."""
