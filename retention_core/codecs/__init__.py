"""What every task codec (request → graph rows → response) is built of (``base``): numpy + tokenizers
only. Each task's own codec lives in its task package (``retention_tasks/<task>/codec.py``), shared by
the service and training-side evaluation so that what we evaluate is what we serve."""
