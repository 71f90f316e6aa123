"""The oracle: every feasible configuration measured, against the planner's choices.

For each batch size B on T cores, a pool for every feasible configuration (instances ⟨t, b⟩ with
Σt ≤ T and Σb = B), timed in --rounds interleaved rounds beside the planner's choices. Verdicts:
the loaded plan within 3 % of the oracle, its prediction within 10 % of the measured.

The bound: every configuration up to EXHAUSTIVE_LIMIT (50,000); past that, the balanced family
(threads split evenly), the required ones (each runtime's fat, identical instances filling the
cores, the planner's choices and their neighbours) and up to --max-configs more per B.
--family identical: only i identical instances ⟨T/i, B/i⟩. --dry-run: the estimated run time
only; --merge: several runs' --json as one report. docs/load-testing.md says more."""

from __future__ import annotations

import contextlib
import datetime
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from packrat.bench.harness import MEMORY_RESERVE_MIB, available_mib, error_text, local_topology, pool_requests
from packrat.bench.oracle_configs import CALL_OVERHEAD_S, EXHAUSTIVE_LIMIT, IDENTICAL_TEXT, POOL_START_S, Config, \
    _about, batch_estimate_s, config_estimate_ms, label, plan_batches, refusal, start_estimate_s, too_sparse, \
    trim_hint
from packrat.bench.oracle_report import build_report, merge, print_report, rescore
from packrat.bench.results import write_json
from packrat.bench.rounds import elapsed_ms, grouped_rounds
from packrat.errors import ProfileError
from packrat.machine.topology import Topology
from packrat.models.modes import served
from packrat.models.runtimes import DEFAULT_RUNTIME
from packrat.profiling.profiles import Profile, default_path as default_profile_path, held
from packrat.serving.payloads import planned_for
from packrat.serving.settling import answered


# ---- the machine side ----------------------------------------------------------------------------

def print_plans(plans: list[dict], estimates: list[dict] | None, args) -> None:
    for i, p in enumerate(plans):
        feasible_text = (f"of {p['feasible']} feasible" if p["feasible"] is not None
                         else f"({IDENTICAL_TEXT})" if p.get("family") == "identical"
                         else f"of more than {EXHAUSTIVE_LIMIT} feasible (balanced family)")
        line = f"B={p['batch']}: {len(p['configs'])} configurations {feasible_text}"
        if estimates:
            e = estimates[i]
            line += f"; about {_about(e['start_s'] + e['timing_s'])} (pools {_about(e['start_s'])}, timing {_about(e['timing_s'])})"
        print(line)
        for kind in ("loaded", "isolated"):
            choice = p["planner"].get(kind)
            if choice:
                print(f"    planner ({kind}): " + (f"{choice['label']}, predicted {choice['predicted_ms']:.1f} ms"
                                                    if choice.get("label") else choice["why"]))
        if args.dry_run or args.verbose:
            print("    " + "; ".join(label(c) for c in p["configs"]))
    if estimates:
        total = sum(e["start_s"] + e["timing_s"] for e in estimates)
        print(f"estimated run time: {_about(total)} ({args.rounds} rounds, {args.warmup} warm-up "
              f"call{'' if args.warmup == 1 else 's'} per configuration; from the profile's latencies and {POOL_START_S:.0f} s per pool start)", flush=True)
        hint = trim_hint(plans, estimates, args.rounds, args.warmup)
        if hint:
            print(hint, flush=True)


def anchored(configs: Sequence[Config], plan: dict) -> tuple[list[Config], list[Config]]:
    """(anchors, the rest): the planner's choices (loaded first) and each runtime's fat, timed in every group."""
    labels = [(plan["planner"].get(kind) or {}).get("label") for kind in ("loaded", "isolated")]
    order = {name: i for i, name in enumerate(dict.fromkeys([n for n in labels if n] + list(plan["fat"])))}
    anchors = sorted((c for c in configs if label(c) in order), key=lambda c: order[label(c)])
    return anchors, [c for c in configs if label(c) not in order]


def rescaled(samples: dict[Config, list[tuple[float, int]]], reference: Config | None) -> dict[Config, float]:
    """Each configuration's median in the reference's time: one timed in group g only is scaled by the
    reference's overall median over its median in g (its ratio to the reference as measured side by side)."""
    medians = {c: statistics.median(ms for ms, *_ in v) for c, v in samples.items() if v}
    if reference not in medians:
        return medians
    by_group: dict[int, list[float]] = {}
    for ms, group, *_ in samples[reference]:
        by_group.setdefault(group, []).append(ms)
    scale = {g: medians[reference] / statistics.median(v) for g, v in by_group.items()}

    def factor(config: Config) -> float:
        groups = {g for _, g, *_ in samples[config]}
        return scale.get(groups.pop(), 1.0) if len(groups) == 1 else 1.0  # the anchors span every group

    return {c: m * factor(c) for c, m in medians.items()}


def held_mib() -> float:
    """The memory this process's children (its pools' instances) hold, resident."""
    import psutil

    def rss(child) -> int:
        with contextlib.suppress(psutil.Error):  # one that ended meanwhile holds none
            return child.memory_info().rss
        return 0

    return sum(rss(child) for child in psutil.Process().children(recursive=True)) / 2 ** 20


class _Pools:
    """Starts, warms, times and stops one B's pools, recording what each did in `results`."""

    def __init__(self, plan: dict, args, topology: Topology, costs: dict, bar, results: dict, anchors: list):
        from packrat.models.zoo import resolve

        self.plan, self.args, self.topology, self.costs, self.bar, self.results = plan, args, topology, costs, bar, results
        self.anchors = anchors
        self.requests = pool_requests(resolve(args.model), plan["batch"])
        self.samples: dict[Config, list] = {c: [] for c in plan["configs"]}  # (ms, group, round)
        self.pools: dict = {}

    def start(self, config: Config) -> bool:
        from packrat.serving.pool.api import InstanceConfig, ModelConfig
        from packrat.serving.pool.instance_pool import InstancePool

        self.bar.set_description(f"B={self.plan['batch']}: pool {label(config)}")
        cores = self.topology.assign([t for t, *_ in config])
        self.results[config]["cores"] = cores
        try:
            instances = [InstanceConfig(t, b, tuple(c), 0, None, runtime) for (t, b, runtime), c in zip(config, cores)]
            model = ModelConfig(self.args.model, graph_mode=self.args.graph_mode, ios_cache=str(self.args.ios_cache))
            self.pools[config] = InstancePool(model, instances)
            for _ in range(self.args.warmup):
                answered(self.pools[config], self.requests)
        except Exception as exc:  # reported, not fatal
            self.results[config]["error"] = f"pool did not start or warm up: {error_text(exc)}"
            self.stop(config)
        self.bar.update(self.costs["start"][config] + self.costs["call"][config] * self.args.warmup)
        return config in self.pools

    def time(self, config: Config, group: int, r: int) -> bool:
        """One call in round r of `group`; False when it failed (the pool is then timed no further)."""
        self.bar.set_description(f"B={self.plan['batch']}: group {group + 1}, round {r}/{self.args.rounds}")
        if self.results[config]["group"] is None and config not in self.anchors:
            self.results[config]["group"] = group
        elif group and config in self.anchors and r == 1:  # the anchors are timed again beside each group
            self.bar.total += self.args.rounds * self.costs["call"][config]
        try:
            self.samples[config].append((elapsed_ms(lambda: answered(self.pools[config], self.requests)), group, r))
        except Exception as exc:
            self.results[config]["error"] = f"round {r} failed: {exc}"
            self.stop(config)
        self.bar.update(self.costs["call"][config])
        return config in self.pools

    def stop(self, config: Config) -> None:
        if (pool := self.pools.pop(config, None)) is not None:
            pool.close()


def time_batch(plan: dict, args, topology: Topology, costs: dict, bar) -> dict:
    """This B's configurations in interleaved rounds: the anchors kept started, the rest in groups memory fits."""
    batch = plan["batch"]
    results = {c: {"label": label(c), "config": [list(s) for s in c], "cores": None, "samples_ms": [],
                   "predicted_ms": plan.get("predicted", {}).get(c), "group": None,
                   "median_ms": None, "error": None} for c in plan["configs"]}
    start_time = time.monotonic()
    anchors, rest = anchored(plan["configs"], plan)
    timer = _Pools(plan, args, topology, costs, bar, results, anchors)
    full = ((lambda: held_mib() > args.memory_mib) if args.memory_mib is not None  # a cap: what the pools hold
            else (lambda: available_mib() < MEMORY_RESERVE_MIB))
    groups = None  # None: interrupted, the rounds timed so far kept
    try:
        groups = grouped_rounds(anchors, rest, timer.start, timer.time, timer.stop, args.rounds,
                                random.Random(args.seed * 1_000_003 + batch * 1009), full)
    except KeyboardInterrupt:
        print(f"B={batch}: interrupted; the rounds timed so far are kept", file=sys.stderr, flush=True)
    finally:
        for config in list(timer.pools):
            timer.stop(config)
    if groups and groups > 1:
        print(f"B={batch}: {len(rest)} configurations in {groups} groups that fit the free memory, each timed "
              f"beside the {len(anchors)} anchors (plans and fat instances)", file=sys.stderr, flush=True)
    reference = next((c for c in anchors if timer.samples[c] and not results[c]["error"]), None)
    medians = rescaled({c: v for c, v in timer.samples.items() if not results[c]["error"]}, reference)
    for config, result in results.items():
        result["samples_ms"] = [ms for ms, *_ in timer.samples[config]]
        result["sample_rounds"] = [[group, r] for _, group, r in timer.samples[config]]  # pairs the rounds
        result["median_ms"] = medians.get(config)
    return {"batch": batch, "feasible": plan["feasible"], "fat": plan["fat"], "planner": plan["planner"],
            "configs": list(results.values()), "groups": groups, "wall_s": time.monotonic() - start_time}


def _meta(args, topology: Topology, profile_path: Path, profile: Profile) -> dict:
    import torch

    from packrat.machine.topology import cpu_model

    return {"model": args.model, "threads": topology.num_cores, "cores": topology.cores, "rounds": args.rounds,
            "warmup": args.warmup, "max_configs": args.max_configs, "family": args.family, "seed": args.seed,
            "runtimes": list(args.runtimes),
            "cpu": cpu_model(), "torch": torch.__version__, "python": platform.python_version(), "profile": str(profile_path),
            "profile_metadata": profile.metadata, "profile_loaded": profile.loaded,
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def run(args) -> int:
    topology = local_topology(args.threads)
    profile_path = args.profile or default_profile_path(args.model)
    profile = held(profile_path)  # None: no points (or no file), refused below
    if profile is not None:  # its pools answer raw tensors: planned as the engine plans for them
        profile = planned_for(profile, raw_share=1.0)
    # the pools run the model as the profile measured it, as the server does
    args.graph_mode = served(profile.metadata.get("mode") if profile is not None else None)
    if profile is not None and not profile.loaded:
        print(f"note: {profile_path} has no loaded figures; the loaded planner is not evaluated", file=sys.stderr)
    from packrat.models.runtimes import installed  # by default: what the profile measured and this machine has
    args.runtimes = args.runtimes or tuple(r for r in (profile.measured_runtimes if profile is not None else ())
                                           if installed(r)) or (DEFAULT_RUNTIME,)  # (a plan may take any of them)
    plans = plan_batches(args, profile, topology)
    asked = profile is not None or args.profile is not None or not args.dry_run  # a dry run may go without one
    if asked and (reasons := too_sparse(plans, profile, topology.num_cores)):
        raise ProfileError(refusal(profile_path, reasons, args.model, topology.num_cores, profile))
    isolated, loaded, estimates = None, None, None
    if profile is not None:  # a profile of loaded figures only estimates from those
        isolated, loaded = dict(profile.isolated) or dict(profile.latency), dict(profile.latency) if profile.loaded else None
        estimates = [batch_estimate_s(p["configs"], args.rounds, args.warmup, isolated, loaded) for p in plans]
    print(f"{args.model} on T={topology.num_cores} (cores {topology.cores}), profile "
          f"{profile_path if profile is not None else '(none yet)'}")
    print_plans(plans, estimates, args)
    if args.dry_run:
        return 0
    from tqdm import tqdm

    json_path = args.json or Path("out") / f"oracle-{Path(args.model).stem.replace(':', '_')}.json"
    meta = _meta(args, topology, profile_path, profile)
    entries: list[dict] = []
    total = sum(e["start_s"] + e["timing_s"] for e in estimates)
    with tqdm(total=total, disable=args.quiet, unit="s", bar_format="{desc} {percentage:3.0f}%|{bar}| "
              "[{elapsed}<{remaining}]") as bar:
        for plan in plans:
            costs = {"start": {c: start_estimate_s(c, isolated) for c in plan["configs"]},
                     "call": {c: config_estimate_ms(c, isolated, loaded) / 1e3 + CALL_OVERHEAD_S
                              for c in plan["configs"]}}
            entries.append(time_batch(plan, args, topology, costs, bar))
            write_json(json_path, build_report(meta, entries))  # after each B, so an interrupted run keeps them
            if entries[-1]["groups"] is None:
                break
    report = build_report(meta, entries)
    write_json(json_path, report)
    print_report(report)
    print(f"\nall figures (every configuration's samples and median): {json_path}")
    return 130 if entries and entries[-1]["groups"] is None else 0


def report_merged(paths: Sequence[Path], profile: Path | None, json_path: Path | None) -> int:
    """--merge: one report of several runs' JSON (with `profile`: that profile's choices)."""
    report = merge(paths)
    if profile:
        report = rescore(report, profile)
    print_report(report)
    if json_path:
        write_json(json_path, report)
    return 0
