"""Training a run: the objective (``objective``), the training loop, checkpoints and run directories
(``fit``), the training precision (``precision``), and retrofits of an existing model (``retrofit``; what
the task packages' recipe builders share, ``retrofit_recipes``; Hugging Face classifier checkpoints,
``hf_checkpoint``)."""
