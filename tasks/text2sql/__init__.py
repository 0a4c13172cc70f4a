"""Text-to-SQL: generation with database validation and error-feedback retries, SQL corpora (TPC-DS, Spider, BIRD), Spider execution accuracy (EX) and SQL structural features."""
