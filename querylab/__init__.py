"""querylab: benchmark LLMs and LLM agents on real, perturbed multi-database datasets."""

__version__ = "0.1.0"
