"""One module per CLI verb: only click code, calling plain functions."""
