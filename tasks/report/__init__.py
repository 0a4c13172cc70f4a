"""The report: pass@k, cost, failure-mode (FM1–FM5), tool-use and agent tables with Polars (streaming), plots, the Markdown/HTML report and the transcript viewer."""
