"""Memory per instance of each kind: what a pool of `instances` one-thread instances of a runtime
adds to the machine, in the engine's own process (thread instances) and in its instance processes.

USS (the pages a process alone holds) is the figure: shared libraries mapped by several processes are
counted once, where RSS counts them in each. The engine's baseline is taken with torch and the
runtime already imported, as an engine has them before its pool starts.
"""

from __future__ import annotations

import gc
import os

import psutil

MIB = 2 ** 20


def instance_memory(model: str, runtime: str, instances: int = 2) -> dict:
    """{model, runtime, kind, instances, engine_mib, children_mib, per_instance_mib}: the USS the
    pool's instances added, in MiB, after each answered a batch of one."""
    import torch  # noqa: F401  (in the baseline, as in an engine)

    from packrat.models.runtimes import base_runtime, ensure_artefact, installed, instance_kind
    from packrat.models.zoo import resolve
    from packrat.serving.pool.instance_pool import InstanceConfig, InstancePool, ModelConfig, Request

    spec = resolve(model)
    if base_runtime(runtime) != "inductor" and installed(runtime):
        ensure_artefact(spec, runtime)
        __import__(base_runtime(runtime))
    cores = sorted(os.sched_getaffinity(0))
    engine = psutil.Process()
    gc.collect()
    before = engine.memory_full_info().uss
    configs = [InstanceConfig(1, 1, (cores[i % len(cores)],), runtime=runtime) for i in range(instances)]
    body = spec.example_inputs(1)[0].numpy().tobytes()
    with InstancePool(ModelConfig(model), configs if len(cores) >= instances else configs[:1]) as pool:
        pool.infer([Request(body, "application/octet-stream")] * len(pool.configs))
        gc.collect()
        engine_mib = (engine.memory_full_info().uss - before) / MIB
        children = [psutil.Process(pid).memory_full_info().uss for pid in set(pool.pids()) - {os.getpid()}]
        count = len(pool.configs)
    children_mib = sum(children) / MIB
    return {"model": model, "runtime": runtime, "kind": instance_kind(runtime), "instances": count,
            "engine_mib": engine_mib, "children_mib": children_mib,
            "per_instance_mib": (max(engine_mib, 0.0) + children_mib) / count}


def format_memory(results: list[dict]) -> str:
    lines = [f"{'model':<14} {'runtime':<20} {'kind':<8} {'instances':>9} {'engine MiB':>11} {'processes MiB':>14} "
             f"{'per instance MiB':>17}"]
    for r in results:
        lines.append(f"{r['model']:<14} {r['runtime']:<20} {r['kind']:<8} {r['instances']:>9} {r['engine_mib']:>11.1f} "
                     f"{r['children_mib']:>14.1f} {r['per_instance_mib']:>17.1f}")
    return "\n".join(lines)
