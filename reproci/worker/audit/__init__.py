"""The op audit: findings, the table of torch's documented ops, the check, attention, the op recorder, fixes.

Worker side: the standard library, torch and numpy only."""
