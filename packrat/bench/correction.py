"""A plan made on wrong figures, corrected while it serves (`benchmarks/served_correction.py`): a
profile's split points made `skew` times their figure, the engine (in this process, no TorchServe)
serves the plan they pick under a closed loop of B users; when it switched on the served figures,
to what, and whether it stayed. `served_dir` keeps the corrections for a later run."""

from __future__ import annotations

import csv
import io
import os
import tempfile
import time
from pathlib import Path

from packrat.bench.users import EngineUsers
from packrat.profiling.profiles import load


SKEWED = ("latency_ms", "isolated_ms", "served_ms", "served_isolated_ms")  # every figure a point may carry


def skewed_profile(source: Path, out: Path, skew: float, cores: int, point: tuple[int, int] | None = None) -> None:
    """`source` with the SKEWED figures of its points under `cores` threads (or `point`'s alone) times `skew`."""
    lines = source.read_text().splitlines(keepends=True)
    meta = [line for line in lines if line.startswith("#")]
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    fields = list(rows[0])
    for row in rows:
        chosen = (int(row["threads"]), int(row["batch"])) == point if point else int(row["threads"]) < cores
        if chosen:
            for column in SKEWED:
                if (row.get(column) or "").strip():
                    row[column] = f"{float(row[column]) * skew:.4f}"
    body = io.StringIO()
    writer = csv.DictWriter(body, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    out.write_text("".join(meta) + body.getvalue())


def correction_run(model: str, profile: Path, batch: int, seconds: float, skew: float = 0.7,
                   progress=None, point: tuple[int, int] | None = None, served_dir: Path | None = None) -> dict:
    """The run of the module's doc; `progress(elapsed_s)` about once a second."""
    from packrat.codec.payloads import build_payload
    from packrat.serving.engine import Engine
    from packrat.settings import SERVED_DIR_ENV, Settings

    with tempfile.TemporaryDirectory(prefix="packrat-correction-") as folder:
        folder = Path(folder)
        os.environ[SERVED_DIR_ENV.name] = str(served_dir or folder / "served")
        cores = len(os.sched_getaffinity(0))
        skewed_profile(profile, folder / "profile.csv", skew, cores, point)
        true_plan = _plan(load(profile), cores, batch)
        settings = Settings(model=model, profiles=("profile.csv",), max_batch=batch, plan_batch=batch,
                            share_node=False)
        engine = Engine(settings, folder, model, max_batch=batch, asynchronous=True)
        first_plan = engine.controller.plan.describe()
        started, wall_started = time.monotonic(), time.time()
        try:
            with EngineUsers(engine, batch, build_payload(model, "raw")) as users:
                while time.monotonic() - started < seconds:
                    time.sleep(1.0)
                    if progress:
                        progress(time.monotonic() - started)
        finally:
            status = engine.status()
            engine.close()
    switches = status["reconfigurations"]  # every plan change: on served figures, trials, the load
    for switch in switches:
        switch["after_s"] = switch["started_at"] - wall_started
    return {"model": model, "batch": batch, "skew": skew, "point": point, "seconds": seconds, "cores": cores,
            "first_plan": first_plan, "plan_from_the_true_profile": true_plan,
            "final_plan": _describe(status), "switches": switches,
            "first_switch_after_s": switches[0]["after_s"] if switches else None,
            "final_plan_since_s": (switches[-1]["after_s"] + switches[-1]["seconds"]) if switches else 0.0,
            "served": status["served"], "health": status["health"], "sent": len(users.latencies_ms),
            "failed": users.failures}


def _plan(profile, cores: int, batch: int) -> str:
    from packrat.machine.topology import Topology
    from packrat.planning.planner import serving_plan

    plan, _ = serving_plan(profile.items(), cores, batch, Topology.virtual(cores), "auto", profile.runtimes)
    return plan.describe()


def _describe(status: dict) -> str:
    from packrat.planning.planner import Instance, Plan

    plan = status["plan"]
    instances = tuple(Instance(i["threads"], i["batch"], 0.0, tuple(i["cores"]), i["runtime"]) for i in plan["instances"])
    return Plan(plan["threads"], plan["batch"], instances, None, None).describe()
