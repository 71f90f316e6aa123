"""A schedule: the stages IOS found for one model, batch size and thread count, as JSON."""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class StagePlan:
    kind: str  # "parallel": groups run concurrently; "merge": one fused convolution
    groups: tuple[tuple[str, ...], ...]  # fx node names, each group in execution order
    threads: tuple[int, ...]  # threads of each group (merge: one entry)
    cost: float | None = None  # ms, as the search measured it (None: not searched)


@dataclass
class Schedule:
    model: str
    batch: int
    threads: int
    stages: list[StagePlan]
    search: dict = field(default_factory=dict)  # seconds, states, measurements, latencies
    costs: object = field(default=None, repr=False, compare=False)  # the search's timing.CostTable, not saved

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "batch": self.batch, "threads": self.threads,
                           "stages": [asdict(stage) for stage in self.stages], "search": self.search}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        try:
            data = json.loads(text)
            stages = [StagePlan(s["kind"], tuple(tuple(g) for g in s["groups"]), tuple(s["threads"]), s.get("cost"))
                      for s in data["stages"]]
            return cls(data["model"], int(data["batch"]), int(data["threads"]), stages, data.get("search", {}))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a schedule: {type(exc).__name__}: {exc}") from None

    @property
    def complete(self) -> bool:
        """Every part searched (a search past its budget leaves the rest sequential, unsearched). A
        schedule from before budgets, or of one thread (nothing to search), is complete."""
        return self.threads == 1 or not self.search.get("unsearched_parts")

    def check_for(self, batch: int, threads: int) -> None:
        """Warn when used for another batch size or thread count than it was found for:
        the best schedule differs between them."""
        if (batch, threads) != (self.batch, self.threads):
            warnings.warn(f"schedule was found for batch {self.batch} and {self.threads} threads, "
                          f"used for batch {batch} and {threads} threads", stacklevel=2)
