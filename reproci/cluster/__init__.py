"""More than one machine: the run's cells (one image, one model, one device kind) as tasks on a
cluster, merged into one results file by the driver. ``engines`` is the interface and the table
of its engines by ``--backend`` name; ``ray_driver`` and ``slurm_driver`` place and collect the
cells that ``cells`` makes; ``cell`` is what a task does on its node; ``combine`` makes the cells'
documents and goldens one, as a single machine would have written them. The CI matrix too:
``github_matrix`` (one job per image), ``kubernetes`` (the same cells as Kubernetes Jobs) and
``merge_shards`` (the per-image results merged into one document)."""
