"""Step schedules for StepLoad, kept free of locust: importing locust monkey-patches the process."""
from __future__ import annotations

import itertools

from .env import STEP_SECONDS, STEP_USERS


def parse_steps(users: str, seconds: str | float) -> list[tuple[float, int]]:
    """Step list as (end time in seconds since the start, users), validated. `seconds` is every
    step's length, or one length per step ("25,20,40")."""
    counts = [int(part) for part in str(users).split(",") if part.strip()]
    lengths = [float(part) for part in str(seconds).split(",") if part.strip()]
    if len(lengths) == 1:
        lengths *= len(counts)
    if not counts or len(lengths) != len(counts) or min(counts) < 0 or min(lengths) <= 0:
        raise ValueError(f"bad step load: users={users!r} seconds={seconds!r}")
    return list(zip(itertools.accumulate(lengths), counts))


def steps_from_env() -> list[tuple[float, int]]:
    """The schedule STEP_USERS and STEP_SECONDS ask for."""
    return parse_steps(STEP_USERS.read(), STEP_SECONDS.read())


def step_markers(steps: list[tuple[float, int]], start: float = 0.0) -> list[tuple[float, str]]:
    """(time, label) at the start of every step, for plot_timeline; start shifts to unix time."""
    begins = [0.0] + [end for end, _ in steps[:-1]]
    return [(start + t, f"{n} users") for t, (_, n) in zip(begins, steps)]
