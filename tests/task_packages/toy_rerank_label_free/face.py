"""The toy reranker's face, unchanged."""

from tests.task_packages.toy_rerank.face import FACE

__all__ = ["FACE"]
