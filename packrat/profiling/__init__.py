"""Profiling: L(t, b) measured point by point in pinned processes, the adaptive grid, profile files, plots,
the default profile a command serves with (measured when missing)."""
