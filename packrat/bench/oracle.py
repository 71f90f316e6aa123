"""The oracle: every feasible configuration measured, against the planner's choices.

On this machine (T = its cores, or --threads), for each batch size B, a pool is built for every
feasible configuration: every multiset of instances ⟨t, b⟩ with Σt ≤ T and Σb = B, up to the bound
below. One B's pools are started and warmed up once, then timed in --rounds interleaved rounds (each
calls every pool once, in a shuffled order, with B raw-tensor requests); a configuration's latency
is its median over the rounds. Pools that would not all fit in memory start in groups, each timed
beside the planner's choices and each runtime's fat, which stay started (rescaled: every ratio to
the plan is one measured side by side). Per B: the oracle (the best configuration); the planner's
choices from the isolated and the loaded figures, each one's latency over the oracle's in the same
round (median over rounds, min–max) and its prediction over its measurement; the fat ⟨T, B⟩ over
the oracle. Verdicts: the loaded plan within 3 % of the oracle at every B, its prediction within
10 % of the measured.

The bound. Configurations are enumerated exhaustively (all_configs) up to EXHAUSTIVE_LIMIT (50,000),
every T ≤ 8 at B ≤ 16; past that, the candidates are the balanced family (balanced_configs: for
every instance count k, threads split evenly, batches in proportion or evenly). Always timed
(required_configs): each runtime's fat, every configuration of identical instances that fills the
cores (k·t = T, k·b = B) under each runtime, the planner's choices and their neighbours (one
instance changed: its runtime, a thread or a request more). Up to --max-configs more per B
(select_configs), ranked by (idle cores, imbalance, shapes, instances), taken round robin over the
instance counts, ends first. --family identical times only i identical instances ⟨T/i, B/i⟩ for
every i dividing T and B, plus the planner's choices: a handful per B, for many cores.

The profile (--profile, else profiles/MODEL.csv) must plan every B: one too sparse is refused, with
why and the command that measures what it lacks; the pools load what it built (the compile cache).
The run time is estimated first (past 10 minutes, with the --rounds that would fit); --dry-run stops
there. Split a long run over several commands with --json each, then report them as one with --merge.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from packrat.errors import NoPlanError, ProfileError
from packrat.models.runtimes import DEFAULT_RUNTIME
from packrat.planning.planner import Planner
from packrat.models.modes import served
from packrat.profiling.profiles import Profile, default_path as default_profile_path, held, load
from packrat.serving.payloads import planned_for
from packrat.machine.topology import Topology

from packrat.bench.harness import MEMORY_RESERVE_MIB, available_mib, error_text, local_topology, pool_requests
from packrat.bench.results import markdown_table, span, write_json
from packrat.serving.settling import answered
from packrat.bench.rounds import elapsed_ms, grouped_rounds, paired

Shape = tuple[int, int, str]  # one instance: (threads, batch, runtime)
Config = tuple[Shape, ...]  # a multiset of instances, canonical: sorted, biggest first

EXHAUSTIVE_LIMIT = 50_000  # beyond this many multisets, candidates come from balanced_configs
MAX_CONFIGS = 40
PLAN_TOLERANCE = 0.03  # target: the loaded plan's measured latency within 3 % of the oracle's
PREDICTION_TOLERANCE = 0.10  # target: the loaded plan's prediction within 10 % of its measured latency
# For the run-time estimate only: a pool's start besides its warm-up (process, import torch, model
# build and TorchScript), and each timed call's overhead besides the model.
POOL_START_S = 6.0
CALL_OVERHEAD_S = 0.005
BUDGET_S = 600.0  # what one command should stay within; above it, the estimate says how to trim


# ---- enumeration (pure) --------------------------------------------------------------------

def arrange(shapes: Iterable[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    """Instance shapes ⟨threads, batch⟩ sorted, biggest first: the families' candidates, before a
    runtime is given to them (canonical)."""
    return tuple(sorted(((int(t), int(b)) for t, b, *_ in shapes), reverse=True))


def canonical(instances: Iterable[Sequence], runtime: str = DEFAULT_RUNTIME) -> Config:
    """A configuration's canonical form: its ⟨threads, batch, runtime⟩ triples sorted, biggest
    first; an instance given as ⟨threads, batch⟩ runs `runtime`."""
    return tuple(sorted(((int(t), int(b), str(rest[0]) if rest else runtime) for t, b, *rest in instances),
                        reverse=True))


def feasible(config: Config, threads: int, batch: int) -> bool:
    """Whether the configuration fits T = threads (Σt ≤ T) and covers B = batch (Σb = B)."""
    return (bool(config) and all(t >= 1 and b >= 1 for t, b, *_ in config)
            and sum(t for t, *_ in config) <= threads and sum(b for _, b, *_ in config) == batch)


class _TooMany(Exception):
    pass


def all_configs(threads: int, batch: int, limit: int | None = None) -> list[Config] | None:
    """Every multiset of instances ⟨t, b⟩ (t, b ≥ 1) with Σt ≤ threads and Σb = batch, each once,
    canonical, in decreasing lexicographic order; None when there are more than `limit`."""
    found: list[Config] = []
    prefix: list[Shape] = []

    def extend(t_left: int, b_left: int, top: Shape) -> None:
        if b_left == 0:
            found.append(tuple(prefix))
            if limit is not None and len(found) > limit:
                raise _TooMany
            return
        if t_left < 1 or (top[0] == 1 and t_left * top[1] < b_left):
            return  # no completion: the shapes left (≤ top) cannot cover b_left
        for t in range(min(top[0], t_left), 0, -1):
            for b in range(b_left if t < top[0] else min(b_left, top[1]), 0, -1):
                prefix.append((t, b))
                extend(t_left - t, b_left - b, (t, b))
                prefix.pop()

    if threads < 1 or batch < 1:
        return []
    try:
        extend(threads, batch, (threads, batch))
    except _TooMany:
        return None
    return found


def _split(total: int, weights: Sequence[int]) -> list[int]:
    """total split in proportion to weights, largest remainders first (ties: earlier first)."""
    weight = sum(weights)
    exact = [total * w / weight for w in weights]
    sizes = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: (-(exact[i] - sizes[i]), i))[: total - sum(sizes)]:
        sizes[i] += 1
    return sizes


def balanced_configs(threads: int, batch: int) -> list[Config]:
    """The candidates when there are too many to enumerate: for every instance count k ≤ min(T, B),
    threads split evenly with no core idle, and ⌊T/k⌋ each; each paired with B split in proportion
    to the threads, and evenly (the extra requests to the most threads, then the fewest)."""
    found: dict[Config, None] = {}
    for k in range(1, min(threads, batch) + 1):
        even = _split(threads, [1] * k)  # descending: the extra threads go first
        for thread_split in (even, [threads // k] * k):
            evenly = _split(batch, [1] * k)
            for batch_split in (_split(batch, thread_split), evenly, evenly[::-1]):
                found[arrange(zip(thread_split, batch_split))] = None
    return [c for c in found if feasible(c, threads, batch)]


def identical_configs(threads: int, batch: int) -> list[Config]:
    """The identical-instance family: for every i dividing both T and B, i instances of
    ⟨T/i threads, batch B/i⟩ (every core used, the batch split evenly), fewest instances first."""
    return [((threads // i, batch // i),) * i for i in range(1, min(threads, batch) + 1)
            if threads % i == 0 and batch % i == 0]


def neighbours(config: Config, threads: int, batch: int, runtimes: Sequence[str]) -> list[Config]:
    """The feasible configurations one instance away from `config`: one instance under another of
    `runtimes`, or given one more thread (from another instance, or an idle core), or one more
    request (from another instance). Where a plan sits beside a better configuration, it is one of
    these more often than not."""
    items, found = list(config), {}
    idle = threads - sum(t for t, *_ in items)

    def changed(index: int, shape: tuple, donor: int | None = None, donated: tuple | None = None) -> None:
        others = [s for k, s in enumerate(items) if k not in (index, donor)]
        found[canonical(others + [shape] + ([donated] if donated else []))] = None

    for i, (t, b, runtime) in enumerate(items):
        for other in runtimes:
            if other != runtime:
                changed(i, (t, b, other))
        if idle:
            changed(i, (t + 1, b, runtime))
        for j, (t2, b2, runtime2) in enumerate(items):
            if j != i and t2 > 1:
                changed(i, (t + 1, b, runtime), j, (t2 - 1, b2, runtime2))
            if j != i and b2 > 1:
                changed(i, (t, b + 1, runtime), j, (t2, b2 - 1, runtime2))
    return [c for c in found if c != canonical(config) and feasible(c, threads, batch)]


def required_configs(threads: int, batch: int, runtimes: Sequence[str], plans: Iterable[Config],
                     allowed=lambda config: True) -> list[Config]:
    """What the oracle always times, beyond its cap: each runtime's fat instance and every
    configuration of identical instances that fills the cores (k·t = T, k·b = B) under each runtime,
    the plans, and each plan's neighbours, where `allowed`."""
    plans = [canonical(plan) for plan in plans]
    found = [canonical(c, runtime) for c in identical_configs(threads, batch) for runtime in runtimes]
    found += plans + [n for plan in plans for n in neighbours(plan, threads, batch, runtimes)]
    return [c for c in dict.fromkeys(found) if allowed(c)]


FAMILIES = ("all", "identical")
IDENTICAL_TEXT = "i identical instances ⟨T/i, B/i⟩ for every i dividing T and B, plus the planner's choices"


def rank_key(config: Config, threads: int, batch: int) -> tuple:
    """Most plausible first: no idle core, then the batch most in proportion to the threads
    (the slowest instance's b/t over B/Σt; 1.0 is perfect), then fewer distinct shapes, fewer
    instances, and the configuration itself (deterministic)."""
    used = sum(t for t, *_ in config)
    imbalance = max(b / t for t, b, *_ in config) / (batch / used)
    return (threads - used, round(imbalance, 9), len(set(config)), len(config), config)


def spread_order(n: int) -> list[int]:
    """0..n-1, ends first, then midpoints coarse to fine: 0, n-1, (n-1)//2, ... (the intervals'
    insides are disjoint, so every midpoint is new)."""
    order, intervals = list(dict.fromkeys([0, n - 1])) if n > 0 else [], [(0, n - 1)]
    while intervals:
        following = []
        for low, high in intervals:
            if high - low > 1:
                order.append((low + high) // 2)
                following += [(low, order[-1]), (order[-1], high)]
        intervals = following
    return order


def select_configs(threads: int, batch: int, max_configs: int | None = MAX_CONFIGS, keep: Iterable[Config] = (),
                   exhaustive_limit: int = EXHAUSTIVE_LIMIT, family: str = "all",
                   runtimes: Sequence[str] = (DEFAULT_RUNTIME,), allowed=lambda config: True
                   ) -> tuple[list[Config], int | None]:
    """The configurations to time for T = threads, B = batch, sorted by rank_key, and how many
    feasible ones exist (None past exhaustive_limit, where the candidates are balanced_configs, and
    for family "identical", whose candidates are identical_configs). Each candidate comes once per
    runtime of `runtimes`, every instance running it, where `allowed(config)`. Every one in `keep` is
    included (ValueError if infeasible); beyond them, up to max_configs more (None: no bound), the
    candidates by rank_key, taken round robin over instance counts in spread_order."""
    kept: list[Config] = []
    for config in keep:
        config = canonical(config)
        if not feasible(config, threads, batch):
            raise ValueError(f"{label(config)} does not fit T={threads}, B={batch}")
        if config not in kept:
            kept.append(config)
    if family == "identical":
        everything, candidates = None, identical_configs(threads, batch)
    else:
        everything = all_configs(threads, batch, exhaustive_limit)
        candidates = everything if everything is not None else balanced_configs(threads, batch)
    candidates = [c for c in (canonical(c, runtime) for c in candidates for runtime in runtimes) if allowed(c)]
    chosen = set(kept)
    room = len(candidates) if max_configs is None else max_configs  # beyond the kept ones
    by_count: dict[int, list[Config]] = {}
    for config in sorted(candidates, key=lambda c: rank_key(c, threads, batch)):
        if config not in chosen:
            by_count.setdefault(len(config), []).append(config)
    counts = sorted(by_count)
    lists = [by_count[counts[i]] for i in spread_order(len(counts))]
    position = 0
    while room > 0 and any(position < len(ranked) for ranked in lists):
        for ranked in lists:
            if room > 0 and position < len(ranked):
                chosen.add(ranked[position])
                room -= 1
        position += 1
    return sorted(chosen, key=lambda c: rank_key(c, threads, batch)), (
        len(everything) if everything is not None else None)


def label(config: Config) -> str:
    """E.g. '2×⟨1,4⟩ + ⟨2,8,openvino⟩' (⟨threads, batch⟩ per instance, biggest first, and its
    runtime unless it is torch's own)."""
    parts: list[str] = []
    for shape in dict.fromkeys(config):
        n = config.count(shape)
        t, b, runtime = canonical([shape])[0]
        text = f"⟨{t},{b}⟩" if runtime == DEFAULT_RUNTIME else f"⟨{t},{b},{runtime}⟩"
        parts.append(f"{n}×{text}" if n > 1 else text)
    return " + ".join(parts)


# ---- estimates from the profile (pure) -------------------------------------------------------

def estimate_ms(table: dict[tuple[int, int], float], threads: int, batch: int) -> float:
    """L(t, b) from a profile table: the point itself, else interpolated linearly in b between
    the profiled batches of the same t (proportionally to b outside them); a t never profiled
    takes the nearest profiled t's figure scaled by t'/t."""
    if (threads, batch) in table:
        return table[threads, batch]
    profiled = sorted({t for t, _ in table})
    if threads not in profiled:
        nearest = min(profiled, key=lambda t: (abs(t - threads), t))
        return estimate_ms(table, nearest, batch) * nearest / threads
    batches = sorted(b for t, b in table if t == threads)
    below = [b for b in batches if b < batch]
    above = [b for b in batches if b > batch]
    if below and above:
        low, high = below[-1], above[0]
        share = (batch - low) / (high - low)
        return table[threads, low] + share * (table[threads, high] - table[threads, low])
    nearest = below[-1] if below else above[0]
    return table[threads, nearest] * batch / nearest


def config_estimate_ms(config: Config, isolated: dict, loaded: dict | None) -> float:
    """A configuration's latency as the profile predicts it: its slowest instance, by the loaded
    figures when it has several instances (and the profile has them), else the isolated ones."""
    table = loaded if loaded and len(config) > 1 else isolated
    return max(estimate_ms(table, t, b) for t, b, *_ in config)


def start_estimate_s(config: Config, isolated: dict) -> float:
    """A pool's start: the process and model, then its instances' warm-up in parallel (each runs
    its batch, halving down to 1, twice)."""
    def warm(t: int, b: int) -> float:
        sizes = [b >> k for k in range(b.bit_length())]
        return 2 * sum(estimate_ms(isolated, t, s) for s in sizes) / 1e3

    return POOL_START_S + max(warm(t, b) for t, b, *_ in config)


def batch_estimate_s(configs: Sequence[Config], rounds: int, warmup: int, isolated: dict,
                     loaded: dict | None) -> dict[str, float]:
    """Seconds one B takes: starting its pools, and warm-up plus rounds of timed calls."""
    calls = sum(config_estimate_ms(c, isolated, loaded) / 1e3 + CALL_OVERHEAD_S for c in configs)
    return {"start_s": sum(start_estimate_s(c, isolated) for c in configs), "timing_s": calls * (rounds + warmup)}


def _about(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


# ---- the report (pure: from the JSON-able results) -------------------------------------------

def by_round(config: dict) -> dict[tuple[int, int], float]:
    """A timed configuration's figure in each (group, round) it ran in (none in files from before rounds were kept)."""
    return {tuple(key): ms for key, ms in zip(config.get("sample_rounds", []), config["samples_ms"])}


def summarize_batch(entry: dict) -> dict:
    """The oracle and the planner's choices for one B, as ratios (None where unavailable): a choice
    over the best is the median over rounds of the two's figures in the same round (paired), with
    the rounds' min–max; the ratio of their medians where no rounds were kept."""
    timed = {c["label"]: c for c in entry["configs"] if c.get("median_ms") is not None}
    summary: dict = {"batch": entry["batch"], "timed": len(timed), "failed": len(entry["configs"]) - len(timed)}
    if not timed:
        return summary
    best = min(timed.values(), key=lambda c: (c["median_ms"], c["label"]))
    summary.update(best=best["label"], best_ms=best["median_ms"])
    for kind in ("loaded", "isolated"):
        choice = entry["planner"].get(kind)
        if not choice or choice.get("label") is None:
            summary[kind] = {"label": None, "why": (choice or {}).get("why", "no such profile figures")}
            continue
        measured = timed.get(choice["label"])
        row = {"label": choice["label"], "predicted_ms": choice["predicted_ms"]}
        if measured is None:
            row["why"] = "its pool failed"
        else:
            pairs = paired(by_round(measured), by_round(best))
            row.update(measured_ms=measured["median_ms"], predicted_vs_measured=choice["predicted_ms"] / measured["median_ms"],
                       vs_best=statistics.median(pairs) if pairs else measured["median_ms"] / best["median_ms"])
            if pairs:
                row["vs_best_spread"] = [min(pairs), max(pairs)]
        summary[kind] = row
    fats = entry.get("fat", [])  # each runtime's fat instance (one label in files from before runtimes)
    fat = min((timed[f]["median_ms"] for f in ([fats] if isinstance(fats, str) else fats) if f in timed), default=None)
    summary["fat_vs_best"] = fat / best["median_ms"] if fat else None
    return summary


TARGETS = {  # summary key -> whether a value meets its target; the suite's summary judges by these too
    "vs_best": lambda v: v <= 1 + PLAN_TOLERANCE,
    "predicted_vs_measured": lambda v: abs(v - 1) <= PREDICTION_TOLERANCE + 1e-12,
}


def met(key: str, value: float | None) -> bool:
    """Whether `value` (a summary's vs_best or predicted_vs_measured) meets its target; a value that
    could not be measured does not."""
    return value is not None and TARGETS[key](value)


def verdicts(summaries: Sequence[dict], kind: str = "loaded") -> list[str]:
    """One line per target for the `kind` profile's plans, computed from the summaries."""
    tag = f"{kind} profile"

    def verdict(name: str, key: str, tolerance: float, text: str) -> str:
        # a B where no pool, or not the plan's, could be timed fails: its verdict is not known
        unmeasured = [s["batch"] for s in summaries
                      if "best_ms" not in s or s.get(kind, {}).get("why") == "its pool failed"]
        if unmeasured:
            return f"{name}: FAIL ({tag}: not measured at B={','.join(map(str, unmeasured))})"
        rows = [s for s in summaries if "best_ms" in s]
        missing = [s["batch"] for s in rows if s.get(kind, {}).get(key) is None]
        if not rows or missing:  # the profile has no figures of this kind to plan with
            return f"{name}: n/a ({tag}: no figure at B={','.join(map(str, missing)) or '-'})"
        worst = max(rows, key=lambda s: (abs(s[kind][key] - 1), s["batch"]))
        spread = worst[kind].get(f"{key}_spread")
        passed = all(met(key, s[kind][key]) for s in rows)
        return (f"{name}: {'PASS' if passed else 'FAIL'} ({tag}: {text} {tolerance:.0%} at every B; worst "
                f"{worst[kind][key]:.3f}" + (f" (rounds {spread[0]:.3f}–{spread[1]:.3f})" if spread else "")
                + f" at B={worst['batch']})")

    return [verdict("plan within 3 % of the oracle", "vs_best", PLAN_TOLERANCE, "measured/best ≤ 1 +"),
            verdict("prediction within 10 % of measured", "predicted_vs_measured", PREDICTION_TOLERANCE,
                    "|predicted/measured − 1| ≤")]


def _ratio(row: dict | None, key: str) -> str:
    """A ratio, with its rounds' min–max where it was paired."""
    value, spread = (row or {}).get(key), (row or {}).get(f"{key}_spread")
    return "-" if value is None else f"{value:.2f}" + (f" ({span(spread)})" if spread else "")


def markdown(report: dict) -> str:
    """The per-B table for BENCHMARKS.md."""
    meta = report["meta"]
    lines = [f"{meta['model']}, T = {meta['threads']} threads ({meta.get('cpu', '?')}), medians of "
             f"{meta['rounds']} interleaved rounds; ⟨t,b⟩ = an instance with t threads at batch b; "
             "meas/best: the plan's latency over the oracle's in the same round, median over rounds (min–max); "
             "pred/meas: the planner's predicted latency over its measured one." + (f" Configurations: {IDENTICAL_TEXT}; the oracle is the best of them."
                                    if meta.get("family") == "identical" else ""), ""]
    rows = []
    for s in report["summaries"]:
        if "best_ms" not in s:
            rows.append([s["batch"], 0, "(no pool started)"] + [""] * 8)
            continue
        cells = [s["batch"], str(s["timed"]) + (f" (+{s['failed']} failed)" if s["failed"] else ""),
                 s["best"], f"{s['best_ms']:.1f}"]
        for kind in ("loaded", "isolated"):
            row = s.get(kind) or {}
            cells += [row.get("label") or "-", _ratio(row, "vs_best"), _ratio(row, "predicted_vs_measured")]
        rows.append(cells + [_ratio(s, "fat_vs_best")])
    return "\n".join(lines + [markdown_table(["B", "configs", "oracle (best)", "best ms", "loaded plan", "meas/best",
                                               "pred/meas", "isolated plan", "meas/best", "pred/meas",
                                               "fat meas/best"], rows)])


def build_report(meta: dict, entries: Sequence[dict]) -> dict:
    entries = sorted(entries, key=lambda e: e["batch"])
    summaries = [summarize_batch(e) for e in entries]
    return {"meta": meta, "batches": entries, "summaries": summaries,
            "verdicts": {kind: verdicts(summaries, kind) for kind in ("loaded", "isolated")}}


def print_report(report: dict) -> None:
    print("\n" + "\n".join([markdown(report), "", *report["verdicts"]["loaded"],
                             *(f"(for comparison) {line}" for line in report["verdicts"]["isolated"])]))
    for entry in report["batches"]:
        for c in entry["configs"]:
            if c.get("error"):
                print(f"B={entry['batch']}: {c['label']} not timed: {c['error']}")


def merge(paths: Sequence[Path]) -> dict:
    """One report from several runs' JSON (later files win for a B measured twice)."""
    entries: dict[int, dict] = {}
    meta = None
    for path in paths:
        report = json.loads(Path(path).read_text())
        if meta is not None and (meta["model"], meta["threads"]) != (report["meta"]["model"], report["meta"]["threads"]):
            raise ValueError(f"{path}: {report['meta']['model']} on T={report['meta']['threads']}, not "
                             f"{meta['model']} on T={meta['threads']} like the files before it")
        meta = meta or dict(report["meta"])
        meta["rounds"] = report["meta"]["rounds"] if meta["rounds"] == report["meta"]["rounds"] else "varying"
        for entry in report["batches"]:
            entries[entry["batch"]] = entry
    return build_report(meta, list(entries.values()))


def rescore(report: dict, profile_path: Path) -> dict:
    """The same timings judged against another profile's choices: configurations are timed
    independently of any profile, so a profile measured later (another method) can be scored
    on them, as long as its choices were among the configurations timed."""
    profile = planned_for(load(profile_path), raw_share=1.0)  # the configurations answered raw tensors
    topology = local_topology(report["meta"]["threads"])
    entries = [{**entry, "planner": {kind: planner_choice(profile, kind, topology.num_cores, entry["batch"], topology)
                                     for kind in ("isolated", "loaded")}} for entry in report["batches"]]
    return build_report({**report["meta"], "profile": str(profile_path), "rescored": True}, entries)


# ---- the machine side ------------------------------------------------------------------------

def too_sparse(plans: Sequence[dict], profile: Profile | None, threads: int) -> dict[int, str]:
    """Why each B that no figure of `profile` could plan (neither planner choice in `plans` has a
    configuration) cannot be: it has no points, or its points cannot make batch B on the cores. A
    sparse profile whose points make every B is planned as it is: {} then."""
    points = sorted(profile.latency) if profile is not None else []
    shown = ", ".join(f"⟨{t},{b}⟩" for t, b in points[:6]) + (f" and {len(points) - 6} more" if len(points) > 6 else "")
    return {p["batch"]: "it has no points" if not points else
            (f"its points ⟨threads, batch⟩ ({shown}) cannot make batch {p['batch']} on {threads} cores: no set of "
             f"them has Σ threads ≤ {threads} and Σ batch = {p['batch']}")
            for p in plans if not any(choice.get("config") for choice in p["planner"].values())}


def refusal(path: Path, reasons: dict[int, str], model: str, threads: int, profile: Profile | None) -> str:
    """The words the oracle refuses a profile too sparse to plan with in, and the command that measures what it lacks."""
    batches = sorted(set(profile.batches if profile is not None else []) | set(reasons))
    head = f"{path} is too sparse to plan with:" if Path(path).exists() else f"no profile at {path}:"
    return "\n".join([head] + [f"  B={b}: {why}" for b, why in reasons.items()] + [
        f"measure the points the plans need (those already in it are kept; a larger --budget-s where the last run "
        f"ran out): packrat profile --model {model} --threads 1-{threads} --batches {','.join(map(str, batches))} "
        f"--out {path}"])


def planner_choice(profile: Profile, kind: str, threads: int, batch: int, topology: Topology) -> dict:
    """The planner's configuration for T, B from the profile's `kind` figures, with its prediction."""
    try:
        items = profile.items(kind)
    except ValueError as exc:  # ProfileError: no loaded figures
        return {"label": None, "why": str(exc)}
    try:
        plan = Planner(items, threads, batch).plan(threads, batch, topology)
    except NoPlanError as exc:
        return {"label": None, "why": f"no plan: {exc}"}
    config = canonical((i.threads, i.batch, profile.runtimes.get((i.threads, i.batch), DEFAULT_RUNTIME))
                       for i in plan.instances)
    return {"label": label(config), "config": [list(s) for s in config], "predicted_ms": plan.expected_latency_ms,
            "describe": plan.describe()}


def predicted_ms(config: Config, points: dict) -> float | None:
    """A configuration's latency as the profile's planned figures predict it: its slowest instance's
    ⟨threads, batch, runtime⟩ figure; None where one of them was not measured."""
    figures = [points.get(shape) for shape in config]
    return None if None in figures else max(figures)


def searched(config: Config, points: dict) -> bool:
    """Whether every IOS instance of `config` has a point in the profile, so its schedule was searched
    (and kept) when it was profiled: an IOS configuration elsewhere would search for minutes as its
    pool starts."""
    return all(runtime != "ios" or (t, b, runtime) in points for t, b, runtime in config)


def plan_batches(args, profile: Profile | None, topology: Topology) -> list[dict]:
    """Per B: the planner's choices and the configurations to time, each with its prediction."""
    threads = topology.num_cores
    plans = []
    for batch in args.batches:
        points = profile.points() if profile is not None else {}
        fats = [fat for fat in (((threads, batch, runtime),) for runtime in args.runtimes) if searched(fat, points)]
        choices = {kind: planner_choice(profile, kind, threads, batch, topology) for kind in ("isolated", "loaded")} \
            if profile is not None else {}
        chosen = [tuple(map(tuple, c["config"])) for c in choices.values() if c.get("config")]
        keep = fats + required_configs(threads, batch, args.runtimes, chosen, lambda c: searched(c, points))
        configs, feasible_count = select_configs(threads, batch, args.max_configs, keep, family=args.family,
                                                 runtimes=args.runtimes, allowed=lambda c: searched(c, points))
        plans.append({"batch": batch, "configs": configs, "feasible": feasible_count, "planner": choices,
                      "fat": [label(fat) for fat in fats], "family": args.family,
                      "predicted": {c: predicted_ms(c, points) for c in configs}})
    return plans


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


def trim_hint(plans: list[dict], estimates: list[dict], rounds: int, warmup: int,
              budget_s: float = BUDGET_S) -> str | None:
    """How to keep one command within budget_s, when the estimate exceeds it: the rounds that
    would fit, and each B's share, to split --batches over several commands."""
    total = sum(e["start_s"] + e["timing_s"] for e in estimates)
    if total <= budget_s:
        return None
    start = sum(e["start_s"] for e in estimates)
    per_round = sum(e["timing_s"] for e in estimates) / (rounds + warmup)
    fit = int((budget_s - start) / per_round) - warmup if per_round > 0 else rounds
    shares = ", ".join(f"B={p['batch']} {_about(e['start_s'] + e['timing_s'])}" for p, e in zip(plans, estimates))
    rounds_text = f"--rounds {fit} would fit" if fit >= 1 else "no number of rounds fits"
    return (f"over {_about(budget_s)}: {rounds_text}; or split --batches over several commands with --json "
            f"each, then --merge (per B: {shares})")


def anchored(configs: Sequence[Config], plan: dict) -> tuple[list[Config], list[Config]]:
    """(anchors, the rest): the planner's choices and each runtime's fat, timed in every group, the
    loaded plan first; the rest of the configurations."""
    labels = [(plan["planner"].get(kind) or {}).get("label") for kind in ("loaded", "isolated")]
    order = {name: i for i, name in enumerate(dict.fromkeys([n for n in labels if n] + list(plan["fat"])))}
    anchors = sorted((c for c in configs if label(c) in order), key=lambda c: order[label(c)])
    return anchors, [c for c in configs if label(c) not in order]


def rescaled(samples: dict[Config, list[tuple[float, int]]], reference: Config | None) -> dict[Config, float]:
    """Each configuration's median from its (ms, group) samples, in the reference's time: one timed
    in group g only is scaled by the reference's median over all groups over its median in g, so that
    its ratio to the reference is the one measured side by side (with one group, medians as they are)."""
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
    """Time every configuration of this B in interleaved rounds (rounds.grouped_rounds). The anchors
    (planner's choices, each runtime's fat) stay started; the rest start in groups that fit the free
    memory (or --memory-mib), each group timed in rounds with the anchors and stopped before the next
    starts. `bar` (tqdm) advances by `costs`."""
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
