"""Clients of the Adaptive Retention service.

``clients.batch`` (``retention-batch``) talks HTTP only: no torch, no onnxruntime, no ``service``
import. Its ``--engine ray`` is the exception, by design: ``clients.ray_batch`` runs the service's app
in-process in Ray actors (no server), so it is the one module here that imports ``service`` (installed
with the ``ray`` extra), and ``clients.batch`` imports it only inside that branch. ``clients.records``
holds what both engines write. ``tests/test_layering.py`` checks all of it.
"""
