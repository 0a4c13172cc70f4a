"""Scoring: verdicts of each trial against ground truth (validators, DAB's rules), execution match of results, the trace audit, and rescoring a run after a spec fix."""
