"""The OpenMP settings a process that runs IOS schedules starts with: libgomp reads them once, when
torch loads it (why these: runtime.py). Nothing here imports torch, so a command can check them,
and restart itself with them, before it loads torch."""

from __future__ import annotations

import os

OPENMP_ENV = {"GOMP_SPINCOUNT": "10000"}  # idle OpenMP threads sleep after ~0.1 ms, not ~3 ms


def openmp_env() -> dict:
    """This process's environment plus OPENMP_ENV, for a child that will run IOS schedules."""
    return {**os.environ, **OPENMP_ENV}
