"""Locust users per run, as patterns relative to TorchServe's batch size B: "B", "2B", or a fixed "4"."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class UsersPattern:
    """Locust users as a multiple of TorchServe's batch size B ("B", "2B") or a fixed count ("4")."""

    count: int
    per_batch: bool

    def users(self, batch: int) -> int:
        return self.count * batch if self.per_batch else self.count

    def __str__(self) -> str:
        if not self.per_batch:
            return str(self.count)
        return "B" if self.count == 1 else f"{self.count}B"


BATCH_USERS = UsersPattern(1, True)  # the default: enough requests in flight to fill each batch
_USERS_RE = re.compile(r"^(\d*)([bB]?)$")


def parse_users(text: str) -> list[UsersPattern]:
    """"B,2B,4" -> patterns, in order, duplicates dropped; ValueError on anything else."""
    patterns: list[UsersPattern] = []
    for part in text.split(","):
        match = _USERS_RE.match(part.strip())
        if not match or not (match[1] or match[2]):
            raise ValueError(f"{part.strip()!r} is not a users pattern like 4, B or 2B")
        count = int(match[1] or 1)
        if count < 1:
            raise ValueError(f"{part.strip()!r}: users must be >= 1")
        pattern = UsersPattern(count, bool(match[2]))
        if pattern not in patterns:
            patterns.append(pattern)
    return patterns


def users_for_batch(patterns: Sequence[UsersPattern | int], batch: int) -> list[tuple[int, str]]:
    """(users, pattern text) per pattern for this batch size; a count reached twice runs once."""
    runs: list[tuple[int, str]] = []
    for pattern in patterns:
        if isinstance(pattern, int):
            pattern = UsersPattern(pattern, False)
        if pattern.users(batch) not in [users for users, _ in runs]:
            runs.append((pattern.users(batch), str(pattern)))
    return runs
