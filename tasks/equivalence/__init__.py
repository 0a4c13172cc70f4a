"""SQL equivalence: LLM judges, the counterexample finder (small database instances, relational schemas from DDL, dialects, result outcomes) and the equivalence stage."""
