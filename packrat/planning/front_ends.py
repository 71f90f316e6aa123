"""How many front-end processes a node needs, and the cores each one gets. Pure: numbers in, numbers out.

A front end (the KServe server's process: its event loop, the engines' hand-offs, thread instances'
decoding under its interpreter lock) answers at most `ceiling` requests a second on one core, its
ceiling with a model of no cost (`packrat bench http --ceiling` measures it): a request costs it
f = 1 / ceiling CPU seconds. The node's instances answer at most the plans' capacity C, Σ batch /
latency over their instances on the T cores: a request costs them m = T / C. Front end and instances
share the cores, so the node answers at most X = T / (f + m) requests a second, of which one front
end, a single event loop, answers at most `ceiling`. So the node takes

    N = ceil(X · f) = ceil(T · f / (f + m)) = ceil(T · C / (C + T · ceiling))

front ends: the front end's share of a request's CPU time, times the cores; at least one, at most
one per core (each gets whole cores of its own).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Requests a second one front-end process answers per core of its own CPU time, binary v2 bodies of
# the `trivial` model, when nothing measured on this machine says otherwise (docs/serving.md: the
# 2-core VM, `packrat bench http --ceiling`)
DEFAULT_CEILING_RPS = 2500.0


@dataclass(frozen=True)
class FrontEnds:
    """The front ends chosen: how many, and why in words."""

    count: int
    why: str
    capacity_rps: float | None = None
    ceiling_rps: float | None = None

    def to_json(self) -> dict:
        return {"count": self.count, "why": self.why, "capacity_rps": self.capacity_rps,
                "ceiling_rps": self.ceiling_rps}


def front_ends_count(value: str) -> str:
    """A --front-ends value: a count of at least 1, or auto (argparse names the type in its error)."""
    if value == "auto" or (value.isdecimal() and int(value) >= 1):
        return value
    raise ValueError(value)


front_ends_count.__name__ = "--front-ends (a count of at least 1, or auto)"


def capacity_rps(instances: Iterable[tuple[int, float]]) -> float:
    """Requests a second a plan's instances answer back to back: Σ batch / latency, from (batch,
    latency_ms) of each instance; an instance without a figure adds nothing."""
    return sum(batch * 1e3 / latency_ms for batch, latency_ms in instances
               if latency_ms and math.isfinite(latency_ms) and latency_ms > 0)


def share(capacity: float, ceiling: float, cores: int) -> float:
    """T · C / (C + T · ceiling): the cores' worth of front-end work when the node is saturated."""
    if ceiling <= 0 or not math.isfinite(capacity):
        return float(cores)
    return cores * capacity / (capacity + cores * ceiling)


def needed(capacity: float, ceiling: float, cores: int) -> int:
    """Front ends for a node of `cores` cores whose instances answer `capacity` requests a second, one
    front end `ceiling` per core of its own: ceil(share), at least 1, at most `cores`."""
    if cores < 1:
        raise ValueError("front ends need at least one core")
    return max(1, min(cores, math.ceil(share(capacity, ceiling, cores) - 1e-9)))


def choose(asked: str | int, capacity: float | None, ceiling: float, cores: int, ceiling_source: str) -> FrontEnds:
    """The front ends for `asked` ("auto", or a count), with the reason; `capacity`: the node's
    requests a second (None: unknown, one front end); `ceiling`: one front end's, from `ceiling_source`."""
    if str(asked) != "auto":
        count = int(asked)
        if not 1 <= count <= cores:
            raise ValueError(f"--front-ends {count}: between 1 and the {cores} cores of the budget")
        return FrontEnds(count, f"{count} asked for (--front-ends {count})", capacity, ceiling)
    if capacity is None:
        return FrontEnds(1, "auto: the plans' capacity is unknown (no profiled figure): one front end", None, ceiling)
    count = needed(capacity, ceiling, cores)
    return FrontEnds(count, f"auto: the plans answer up to {capacity:,.0f} req/s on {cores} core(s), one front end "
                            f"{ceiling:,.0f} req/s per core ({ceiling_source}): front ends' work at saturation "
                            f"{cores} × {capacity:,.0f} / ({capacity:,.0f} + {cores} × {ceiling:,.0f}) = "
                            f"{share(capacity, ceiling, cores):.2f} cores → {count}", capacity, ceiling)


def split_cores(cores: Sequence[int], count: int) -> list[tuple[int, ...]]:
    """`cores` in `count` contiguous blocks of sizes differing by one at most, the larger first."""
    if not 1 <= count <= len(cores):
        raise ValueError(f"{count} front ends cannot each have a core of {len(cores)}")
    size, extra = divmod(len(cores), count)
    blocks, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        blocks.append(tuple(cores[start:end]))
        start = end
    return blocks
