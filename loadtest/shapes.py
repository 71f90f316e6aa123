"""Step load shape: user count jumps low -> high -> low -> high, then the test stops.

The steps come from the environment (loadtest.env's STEP_USERS and STEP_SECONDS), read when
locust instantiates the shape.
"""
from __future__ import annotations

from locust import LoadTestShape

from .steps import steps_from_env

# Locust adds or removes floor(rate) users per dispatch, so up to 100 users change at once:
# a step, not a ramp. Above 100 locust warns that spawning may misbehave.
STEP_SPAWN_RATE = 100.0


class StepLoad(LoadTestShape):
    def __init__(self) -> None:
        super().__init__()
        self.steps = steps_from_env()

    def tick(self) -> tuple[int, float] | None:
        now = self.get_run_time()
        for end, users in self.steps:
            if now < end:
                return users, STEP_SPAWN_RATE
        return None  # past the last step: locust stops the run
