"""Result files: what a bench or a benchmark measured, as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path


def write_json(path: Path, data) -> None:
    """`data` as JSON at `path`, its folder made first: plans as Plan.to_json(), dataclasses as
    dicts, anything else JSON cannot hold as its str()."""
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
