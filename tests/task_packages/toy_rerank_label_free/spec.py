"""The toy reranker's spec, unchanged."""

from tests.task_packages.toy_rerank.spec import SPEC

__all__ = ["SPEC"]
