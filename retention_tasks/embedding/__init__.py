"""The embedding task: its codec, spec, training entry, dataset and HTTP face (``retention_tasks``)."""
