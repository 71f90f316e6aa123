"""Offline profiler: measures L(t, b) over a grid, each point in a fresh pinned process.

Points are appended to the profile file as they finish, so Ctrl-C leaves a valid
file and a later run with the same arguments measures only what is missing.
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import profile as profile_io
from .topology import Topology, detect


class ProfilingError(RuntimeError):
    """A measurement process failed; the message says which point and why."""


@dataclass(frozen=True)
class Settings:
    model: str
    warmup: int = 10
    iters: int | None = 100
    min_time: float | None = None
    graph_mode: bool = True
    input_shape: tuple[int, ...] | None = None
    ios_cache: str | None = None  # profile IOS-compiled instances; schedules cached here


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def metadata(settings: Settings, topology: Topology) -> dict[str, str]:
    import torch

    from .models import resolve

    spec = resolve(settings.model, settings.input_shape)
    return {
        "model": settings.model,
        "mode": "ios" if settings.ios_cache else ("script" if settings.graph_mode and spec.scriptable else "eager"),
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "cores": str(topology.num_cores),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def measure_point(settings: Settings, threads: int, batch: int, cores: list[int]) -> dict:
    """Run packrat.measure in a fresh process pinned to `cores`; return its statistics."""
    cmd = [sys.executable, "-m", "packrat.measure", "--model", settings.model,
           "--threads", str(threads), "--batch", str(batch), "--cores", ",".join(map(str, cores)),
           "--warmup", str(settings.warmup)]
    if settings.iters is not None:
        cmd += ["--iters", str(settings.iters)]
    if settings.min_time is not None:
        cmd += ["--min-time", str(settings.min_time)]
    if settings.input_shape:
        cmd += ["--input-shape", ",".join(map(str, settings.input_shape))]
    if not settings.graph_mode:
        cmd.append("--eager")
    env = None
    if settings.ios_cache:
        from ios_scheduler.runtime import openmp_env

        cmd += ["--ios-cache", str(settings.ios_cache)]
        env = openmp_env()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ProfilingError(f"measuring threads={threads} batch={batch} failed: {reason}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _existing(out: Path, meta: dict[str, str]) -> set[tuple[int, int]]:
    """Points already measured in `out`, which must be of the same model and mode."""
    if not out.exists() or out.stat().st_size == 0:
        return set()
    existing = profile_io.load(out)
    for key in ("model", "mode"):
        if existing.metadata.get(key, meta[key]) != meta[key]:
            raise profile_io.ProfileError(f"{out}: holds a profile with {key} {existing.metadata[key]!r}, "
                                          f"not {meta[key]!r}; choose another --out")
    return set(existing.latency)


def run(settings: Settings, threads: list[int], batches: list[int], out: str | Path,
        topology: Topology | None = None, progress: bool = True) -> profile_io.Profile:
    """Measure every missing ⟨t, b⟩ of the grid into `out`; return the whole profile."""
    out = Path(out)
    topology = topology or detect()
    too_many = [t for t in threads if t > topology.num_cores]
    if too_many:
        raise ValueError(f"--threads: {max(too_many)} exceeds the {topology.num_cores} cores this process may use")
    meta = metadata(settings, topology)
    done = _existing(out, meta)
    todo = [(t, b) for t in sorted(threads) for b in sorted(batches) if (t, b) not in done]
    # Progress is weighted by expected cost (∝ b / t) so the time-left estimate is useful.
    bar = tqdm(total=sum(b / t for t, b in todo), disable=not progress or not todo, unit="",
               bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
    with bar, profile_io.ProfileWriter(out, meta) as writer:
        for index, (t, b) in enumerate(todo, start=1):
            bar.set_description(f"point {index}/{len(todo)}: threads={t} batch={b}")
            stats = measure_point(settings, t, b, topology.cores_for(t))
            writer.write({"threads": t, "batch": b, **stats})  # columns outside the CSV are dropped
            bar.update(b / t)
    return profile_io.load(out)
