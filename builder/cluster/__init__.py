"""The cluster edge: the Slurm job (model and templates), its default training command, the
cluster verdict the job gathers, and ``doctor``'s pre-flight of a node."""
