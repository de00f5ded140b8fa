"""The summarization task: its codec, spec, training entry (its math in ``learn.py``), datasets and HTTP
face (``retention_tasks``)."""
