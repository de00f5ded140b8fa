"""The task plug-in: what a task hands training and evaluation (``registry``: ``TrainingTask``,
``TaskEvaluation``, ``EvaluationRun``, filled from each task package's ``training.py``), its batches
(``batch``), its codec as training and evaluation use it (``codecs``), and the dense teacher every label-free
retrofit uses (``teacher``)."""
