"""Clients of the Adaptive Retention service (HTTP only: no torch, no onnxruntime)."""
