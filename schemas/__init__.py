"""Pydantic models of specs and configs, and pyarrow schemas of every Parquet artifact."""
