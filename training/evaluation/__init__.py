"""Evaluation: quality vs ρ for the learned retention and its baselines, and the reports.

- ``methods``: the names of the selection methods and baselines every codec-loop task runs.
- ``running``: predictions — ``forward_pruned`` (or a baseline) over codec rows in torch, the exported
  graph in onnxruntime, each row's kept fraction and token-work.
- ``codec_loop``: the loop tasks whose inputs are codec rows share (encode, run, decode, score), and
  ``codec_task_evaluation``, the ``TaskEvaluation`` such a task registers.
- ``reporting``: tables, paired differences and the files a report is written to (torch-free: the
  results page and the studies read it).

A task plugs in with a ``training.tasks.registry.TaskEvaluation``.
"""
