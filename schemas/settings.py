"""Runtime settings: re-exported from :mod:`tasks.core.settings` (the one definition)."""

from tasks.core.settings import Settings

__all__ = ["Settings"]
