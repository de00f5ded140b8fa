"""The shipped tasks, one package each (``retention_core.tasks.SHIPPED_TASKS`` lists them): ``codec.py``
its request → graph rows → response codec and ``spec.py`` what training and serving agree on (both import
only the core), ``training.py`` the torch side and its datasets (the math in ``learn.py``, or in
``training/`` where it is shared), ``face.py`` the HTTP side (docs/architecture.md, "A task is one
folder")."""
