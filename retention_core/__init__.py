"""The torch-free core shared by training and serving.

It holds what both sides must agree on — the model-directory contract and manifest
(``contract``), the task registry filled from the list of task packages (``tasks``; each task's codec
lives in its package, ``retention_tasks/<task>/codec.py``, on the machinery of ``codecs.base``), the keep
schedule (``schedule``), text utilities, task metrics and the token-work definition (``usage``) — and
imports neither ``training`` nor ``service`` (``tests/test_layering.py``).
"""
