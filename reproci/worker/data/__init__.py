"""What a run trains on: the loader and its resume, batches, their checksums and trees.

Worker side: the standard library, torch and numpy only."""
