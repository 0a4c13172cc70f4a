"""Prefect flows: they compose tasks and other flows, nothing else."""
