"""Results and reports: a scenario's JSON file, its figures in words and markdown tables, its verdicts.
No torch here: a command that only formats stays light."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


def write_json(path: Path, data) -> None:
    """`data` as JSON at `path` (folder made): plans by Plan.to_json(), dataclasses as dicts, the rest as str()."""
    def default(value):
        from packrat.planning.planner import Plan

        if isinstance(value, Plan):
            return value.to_json()
        if hasattr(value, "__dataclass_fields__"):
            return asdict(value)
        return str(value)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=default))


@dataclass(frozen=True)
class Verdict:
    name: str
    target: str
    passed: bool
    value: str  # what was measured, in words

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'} {self.name}: {self.value} (target: {self.target})"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt_num(value: float | None, digits: int = 1) -> str:
    """`value` with `digits` decimals; "-" for None, NaN or infinity."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def span(values: Sequence[float] | None, digits: int = 2) -> str:
    """A [min, max] as 'min–max'; '-' for none."""
    return f"{values[0]:.{digits}f}–{values[1]:.{digits}f}" if values else "-"


def with_spread(value: float | None, spread: Sequence[float] | None = None, digits: int = 2) -> str:
    """A figure with the [min, max] of its rounds, as 'value (min–max)'; '-' for none."""
    return "-" if value is None else fmt_num(value, digits) + (f" ({span(spread, digits)})" if spread else "")


def median_text(figure: Mapping | None, digits: int = 2) -> str:
    """A median_spread figure ({"median", "spread"}) as 'median (min–max)'; '-' for none."""
    return with_spread(figure["median"], figure["spread"], digits) if figure else "-"


def markdown_row(cells: Iterable) -> str:
    """One row of a markdown table; cells are str()-ed, pipes escaped, line breaks made spaces."""
    return "| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


def markdown_head(header: Sequence) -> str:
    """A markdown table's header row and the line under it."""
    return markdown_row(header) + "\n" + "|---" * len(header) + "|"


def markdown_table(header: Sequence, rows: Iterable[Sequence]) -> str:
    return "\n".join([markdown_head(header)] + [markdown_row(row) for row in rows])
