"""querylab: benchmark LLMs and LLM agents on real, perturbed multi-database datasets."""

__version__ = "0.1.0"


class UsageError(Exception):
    """Bad command-line input: the CLI prints it as one line and exits with status 2."""
