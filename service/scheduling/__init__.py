"""Scheduling one model's requests: a queue, admission, the rho=auto controller, batches cut into runs.

- ``jobs``: a queued request (``Job``, with ``service.serving.AutoBudget``), the slice of it a batch holds.
- ``batcher``: ``Batcher``, the queue and its worker loop, and the admission glue (one per model).
- ``admission``: the admission rule and the batch-time rho controller (pure, a fake clock in tests).
- ``cost``: the online cost model, the tail factor, the arrival rate (pure).
- ``learning``: one model's costs: seeded by its warm-up, taught by every batch, published as metrics.
- ``planner``: shape lengths and the cut of a batch's rows into runs (pure).
- ``execution``: the model's inference thread and the planned runs executed on it (its backend:
  ``service.backends``, onnxruntime or torch).
- ``delivery``: answering each job as soon as the runs holding its rows are done.
"""
