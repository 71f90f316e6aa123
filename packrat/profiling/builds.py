"""Builds off the measured path (issue 62): the AOT packages inductor's points need in compile mode
(models/compiled.py), built before they are measured, side by side, one a core, into the machine's
compile cache. (OpenVINO and ONNX Runtime convert once per model: runtimes.ensure_artefact; OpenVINO's
own model cache gained nothing: docs/benchmarks/profiles.md.)

A build is `packrat.profiling.point --prepare-only`, the point's own loading code, with torch's
threads at the key's; a core per build packs best, since only torch's thread count enters the code.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import replace

from packrat.machine.topology import Topology
from packrat.profiling.measuring import ProfileSettings, _command, _last_line

POLL_S = 0.05  # how often running builds are looked at while every core has one


def needs_build(settings: ProfileSettings, runtime: str) -> bool:
    """Whether a point of `runtime` has an artefact of its own to build: inductor's AOT packages."""
    from packrat.models.zoo import resolve

    return runtime == "inductor" and settings.graph_mode == "compile" and resolve(
        settings.model, settings.input_shape).scriptable


def built(settings: ProfileSettings, threads: int, batch: int) -> bool:
    from packrat.models.zoo import compiled_package, resolve

    return compiled_package(resolve(settings.model, settings.input_shape), batch, threads=threads).exists()


def build_all(settings: ProfileSettings, points, topology: Topology, say=print) -> dict[str, dict]:
    """Build what the points (runtime, threads, batch) need that is not built yet, a build per core at
    a time: per runtime {"built", "reused", "failed", "seconds": its builds' wall time}. A failed
    build is said with its reason and left to the point (which builds, or fails, as before)."""
    keys: dict[str, set[tuple[int, int]]] = {}
    for runtime, threads, batch in points:
        keys.setdefault(runtime, set()).update([(threads, batch)] if needs_build(settings, runtime) else [])
    found = {}
    for runtime, wanted in keys.items():
        started = time.monotonic()
        todo = sorted((k for k in wanted if not built(settings, *k)), key=lambda k: (-k[1], -k[0]))  # longest first
        failed = _build(replace(settings, runtime=runtime), list(todo), topology, say)
        found[runtime] = {"built": len(todo) - failed, "reused": len(wanted) - len(todo), "failed": failed,
                          "seconds": round(time.monotonic() - started, 1)}
    return found


def _build(settings: ProfileSettings, keys: list[tuple[int, int]], topology: Topology, say) -> int:
    """Build `keys` (threads, batch), one process per key on a free core: how many failed."""
    free, running, failed = list(topology.cores), {}, 0
    try:
        while keys or running:
            if keys and free:
                key, core = keys.pop(0), free.pop(0)
                running[key] = (_start(settings, *key, core), core)
                continue
            time.sleep(POLL_S)
            for key, (proc, core) in [(k, v) for k, v in running.items() if v[0].poll() is not None]:
                del running[key]
                free.append(core)
                with proc.log:
                    if proc.returncode == 0 and built(settings, *key):
                        continue
                    failed += 1
                    proc.log.seek(0)
                    reason = _last_line(proc.log.read().decode(errors="replace"), f"exit status {proc.returncode}")
                say(f"building {settings.runtime} threads={key[0]} batch={key[1]} failed: {reason}")
    finally:  # Ctrl-C, or an error: no build is left running
        for proc, _ in running.values():
            proc.kill()
            proc.wait()
    return failed


def _start(settings: ProfileSettings, threads: int, batch: int, core: int) -> subprocess.Popen:
    """The point's loading code for ⟨threads, batch⟩ on `core`, torch at `threads` threads; its output in .log."""
    cmd, env = _command(settings, threads, batch, [core])
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd + ["--prepare-only"], stdout=log, stderr=log, env=env)
    proc.log = log
    return proc
