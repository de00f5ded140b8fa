"""Adaptive Retention's training side: a recipe → a trained run → a model directory, in rooms named for
the pipeline's parts (each imports only the rooms before it; ``tests/test_layering.py``):

- ``engine``: the retention engine (the retention math, the model, its heads, probe and baselines, the
  wrapped Hugging Face encoders).
- ``recipes``: the typed recipe and the datasets it names.
- ``tasks``: the task plug-in (``TrainingTask``, ``TaskEvaluation``) and its registry, batches, codecs, the
  embedding task's training side.
- ``evaluation``: running predictions, the codec loop, reporting.
- ``fitting``: the objective, the training loop and run directories, retrofits.
- ``export``: graph and parity, two-path, int8, torch weights, manifest, install.
- ``tiny`` (tiny random models) and ``__main__`` (the CLI, ``python -m training``) on top.
"""
