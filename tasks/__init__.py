"""The work: plain functions (wrapped with ``@task`` where a flow maps them)."""
