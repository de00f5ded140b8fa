"""What a run is made of: the typed recipe (``recipe``: profiles, stages, chains) and the datasets it
names (``data``: the registry each task package fills, local files or the hub, deterministic splits)."""
