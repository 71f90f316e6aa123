"""Profiling: L(t, b) measured where a plan depends on it (the search), on pinned workers, profile files,
plots, the default profile a command serves with (measured when missing)."""
