"""querylab: benchmark LLMs and LLM agents on real, perturbed multi-database datasets."""

__version__ = "0.1.0"


class UsageError(Exception):
    """Bad command-line input: the CLI prints it as one line and exits with status 2."""


def shared_data_path(relative: str) -> str | None:
    """``relative`` under the shared data directory (``$QUERYLAB_SHARED_DATA``, else
    ``../shared/data`` beside the repository) when it exists, else None: the default of CLI
    options naming Spider, BIRD, TPC-DS or Chinook files."""
    from tasks.datasets.catalogue import shared_data_dir

    path = shared_data_dir() / relative
    return str(path) if path.exists() else None


def run_id_or_new(run_id: str | None) -> str:
    """``run_id`` when given (resuming that run), else a new ``YYYYmmdd-HHMMSS-xxxx`` id."""
    from tasks.core.runs import new_run_id

    return run_id or new_run_id()
