"""More than one machine: the run's cells (one image, one model, one device kind) as tasks on a
cluster, merged into one results file by the driver. ``ray_driver`` places and collects the
cells on a Ray cluster; ``cell`` is what a task does on its node; ``combine`` makes the cells'
documents and goldens one, as a single machine would have written them."""
