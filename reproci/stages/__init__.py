"""Stages: what runs each model goes through (determinism, throughput, variance)."""
