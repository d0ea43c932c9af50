"""One worker process: its launch environment, its spec, exit codes, progress lines, the environment it reports.

Worker side: the standard library, torch and numpy only."""
