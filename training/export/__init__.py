"""Export: a trained ``RetentionModel`` → a model directory the service reads (``retention_core.contract``).

One module per concern, in the order ``install.export_model`` runs them:

- ``graph``: the served graph traced (``export_onnx``) and checked against torch (``validate_onnx``).
- ``two_path``: the ``If`` choices that join the traced passes; a two-path model's weights beside their
  pass, what its copy's pass reads and what the copy costs.
- ``torch_weights``: ``weights.safetensors`` for the torch backend, checked against ``model.onnx``.
- ``int8`` (with ``token_int8``, its per-token activations): the int8 variant, its calibration and the
  weight MatMuls left fp32 for their outlying inputs.
- ``manifest``: what the directory says of itself (the manifest, the serving tokenizer, versions).
- ``install``: ``export_model`` (stage, validate, measure, write the manifest once) and the atomic swap
  into place.

Beside them: the manifest's speed curve measured on a staged directory (``speed``), the dense baseline
graphs the benchmarks time (``dense_graph``, ``optimize``).
"""
