"""The torch-free core shared by training and serving.

It holds what both sides must agree on — the model-directory contract and manifest
(``contract``), the task registry (``tasks``), the task codecs that turn requests into graph rows and
graph outputs into answers (``codecs``), text utilities, task metrics and the token-work definition
(``usage``) — and imports neither ``training`` nor ``service`` (``tests/test_layering.py``).
"""
