"""The oracle's configurations (packrat bench oracle; oracle.py times them), pure: every feasible multiset
of instances ⟨t, b⟩ or a family, the plans and their neighbours, ranked and capped, with their estimates."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from packrat.errors import NoPlanError
from packrat.machine.topology import Topology
from packrat.models.runtimes import DEFAULT_RUNTIME
from packrat.planning.planner import Planner
from packrat.profiling.profiles import Profile

Shape = tuple[int, int, str]  # one instance: (threads, batch, runtime)
Config = tuple[Shape, ...]  # a multiset of instances, canonical: sorted, biggest first
EXHAUSTIVE_LIMIT = 50_000  # beyond this many multisets, candidates come from balanced_configs
MAX_CONFIGS = 40
# For the run-time estimate only: a pool's start besides its warm-up (process, import torch, model
# build and TorchScript), and each timed call's overhead besides the model.
POOL_START_S = 6.0
CALL_OVERHEAD_S = 0.005
BUDGET_S = 600.0  # what one command should stay within; above it, the estimate says how to trim


# ---- enumeration ---------------------------------------------------------------------------------

def arrange(shapes: Iterable[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    """Instance shapes ⟨threads, batch⟩ sorted biggest first (canonical), before runtimes are given."""
    return tuple(sorted(((int(t), int(b)) for t, b, *_ in shapes), reverse=True))


def canonical(instances: Iterable[Sequence], runtime: str = DEFAULT_RUNTIME) -> Config:
    """⟨threads, batch, runtime⟩ triples sorted biggest first; an instance given as ⟨threads, batch⟩ runs `runtime`."""
    return tuple(sorted(((int(t), int(b), str(rest[0]) if rest else runtime) for t, b, *rest in instances),
                        reverse=True))


def feasible(config: Config, threads: int, batch: int) -> bool:
    """Whether the configuration fits T = threads (Σt ≤ T) and covers B = batch (Σb = B)."""
    return (bool(config) and all(t >= 1 and b >= 1 for t, b, *_ in config)
            and sum(t for t, *_ in config) <= threads and sum(b for _, b, *_ in config) == batch)


class _TooMany(Exception):
    pass


def all_configs(threads: int, batch: int, limit: int | None = None) -> list[Config] | None:
    """Every multiset of ⟨t, b⟩ with Σt ≤ threads and Σb = batch, canonical, descending; None past `limit`."""
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
    """Too many to enumerate: for each instance count k, threads split evenly (or ⌊T/k⌋ each), each with
    B split in proportion to the threads and evenly (extra requests to the most threads, then fewest)."""
    found: dict[Config, None] = {}
    for k in range(1, min(threads, batch) + 1):
        even = _split(threads, [1] * k)  # descending: the extra threads go first
        for thread_split in (even, [threads // k] * k):
            evenly = _split(batch, [1] * k)
            for batch_split in (_split(batch, thread_split), evenly, evenly[::-1]):
                found[arrange(zip(thread_split, batch_split))] = None
    return [c for c in found if feasible(c, threads, batch)]


def identical_configs(threads: int, batch: int) -> list[Config]:
    """i instances of ⟨T/i, B/i⟩ for every i dividing both T and B, fewest instances first."""
    return [((threads // i, batch // i),) * i for i in range(1, min(threads, batch) + 1)
            if threads % i == 0 and batch % i == 0]


def neighbours(config: Config, threads: int, batch: int, runtimes: Sequence[str]) -> list[Config]:
    """Feasible configurations one step away (where a better one usually sits): runtime, +1 thread, +1 request."""
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
    """Timed beyond the cap, where `allowed`: every runtime's fat and identical instances filling the cores,
    the plans and their neighbours."""
    plans = [canonical(plan) for plan in plans]
    found = [canonical(c, runtime) for c in identical_configs(threads, batch) for runtime in runtimes]
    found += plans + [n for plan in plans for n in neighbours(plan, threads, batch, runtimes)]
    return [c for c in dict.fromkeys(found) if allowed(c)]


FAMILIES = ("all", "identical")
IDENTICAL_TEXT = "i identical instances ⟨T/i, B/i⟩ for every i dividing T and B, plus the planner's choices"


def rank_key(config: Config, threads: int, batch: int) -> tuple:
    """Most plausible first: no idle core, then the slowest instance's b/t over B/Σt nearest 1, then fewer
    distinct shapes, fewer instances, and the configuration itself (deterministic)."""
    used = sum(t for t, *_ in config)
    imbalance = max(b / t for t, b, *_ in config) / (batch / used)
    return (threads - used, round(imbalance, 9), len(set(config)), len(config), config)


def spread_order(n: int) -> list[int]:
    """0..n-1, ends first, then midpoints coarse to fine: 0, n-1, (n-1)//2, ... each new."""
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
    """The configurations to time by rank_key (all of `keep`, then up to max_configs round robin over instance
    counts) and how many are feasible (None where not enumerated); ValueError for an infeasible `keep`."""
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
    """E.g. '2×⟨1,4⟩ + ⟨2,8,openvino⟩': ⟨threads, batch⟩ per instance, biggest first, its runtime unless torch's."""
    parts: list[str] = []
    for shape in dict.fromkeys(config):
        n = config.count(shape)
        t, b, runtime = canonical([shape])[0]
        text = f"⟨{t},{b}⟩" if runtime == DEFAULT_RUNTIME else f"⟨{t},{b},{runtime}⟩"
        parts.append(f"{n}×{text}" if n > 1 else text)
    return " + ".join(parts)


# ---- estimates from the profile ------------------------------------------------------------------

def estimate_ms(table: dict[tuple[int, int], float], threads: int, batch: int) -> float:
    """L(t, b): the point, else linear in b between the same t's profiled batches (proportional outside them);
    an unprofiled t takes the nearest profiled t's figure scaled by t'/t."""
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
    """Its slowest instance's latency, by the loaded figures for several instances (where any), else isolated."""
    table = loaded if loaded and len(config) > 1 else isolated
    return max(estimate_ms(table, t, b) for t, b, *_ in config)


def start_estimate_s(config: Config, isolated: dict) -> float:
    """A pool's start: process and model, then its instances' warm-ups in parallel (batch halved to 1, twice)."""
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


# ---- the profile's choices, and what to time at each B ------------------------------------------

def too_sparse(plans: Sequence[dict], profile: Profile | None, threads: int) -> dict[int, str]:
    """Why each B no planner choice in `plans` could plan cannot be: no points, or none that make B on the
    cores ({} when its points make every B)."""
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
    """Its slowest instance's planned ⟨threads, batch, runtime⟩ figure; None where one is not measured."""
    figures = [points.get(shape) for shape in config]
    return None if None in figures else max(figures)


def searched(config: Config, points: dict) -> bool:
    """Whether every IOS instance has a profile point, its schedule searched then (else its pool would search
    for minutes)."""
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


def trim_hint(plans: list[dict], estimates: list[dict], rounds: int, warmup: int,
              budget_s: float = BUDGET_S) -> str | None:
    """Past budget_s: the rounds that would fit, and each B's share to split --batches over commands."""
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
