"""Several models on one machine, their figures (`packrat bench multi-model`): each phase's statistics
normalised to the same round's "alone" (each model served by itself), the node's lead over the other
configurations, the rounds' order and medians. Pure (records need .start, .response_ms, .failed)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from packrat.bench.results import ratio
from packrat.bench.rounds import over_rounds, round_order

LEAD = "packrat-node"  # whose lead over the other configurations is reported
SUMMED, KEPT = ("failures", "requests", "failed_requests"), ("users",)  # over rounds; the rest: median, spread


@dataclass(frozen=True)
class Phase:
    name: str
    users: dict[str, int]  # per model; 0: no load
    seconds: float
    settle_s: float  # left out of the phase's statistics
    measured: bool = True


def alone_phase(users: int) -> str:
    return f"{users} users"


def phase_stats(records, begin: float, end: float) -> dict:
    """The requests that started in [begin, end): counts, p50 / p99 of the answered ones, their rate."""
    inside = [r for r in records if begin <= r.start < end]
    good = [r.response_ms for r in inside if not r.failed]
    q = statistics.quantiles(good, n=100) if len(good) >= 2 else [float("nan")] * 99
    return {"requests": len(inside), "failures": sum(r.failed for r in inside), "p50_ms": q[49], "p99_ms": q[98],
            "rps": len(good) / (end - begin)}


def phase_windows(phases: list[Phase], launched: float) -> list[tuple[Phase, float, float]]:
    """Each measured phase's window: locust starts a second after launch; a phase's settle_s is left out."""
    windows, start = [], launched + 1.0
    for phase in phases:
        if phase.measured:
            windows.append((phase, start + phase.settle_s, start + phase.seconds))
        start += phase.seconds
    return windows


def plan_at(plans: list, when: float) -> dict:
    """The last of `plans` ([(t, {model: expected slowdown})], oldest first) seen by `when`; {} if none."""
    seen = [plan for t, plan in plans if t <= when]
    return seen[-1] if seen else {}


def summarise(phases: list[Phase], runs: dict, plans: list | None = None) -> dict:
    """Per measured phase each loaded model's statistics (and, with `plans`, expected slowdown); all failures.
    `runs`: {model: (launch time, records)}."""
    out = {"phases": {p.name: {"models": {}} for p in phases if p.measured},
           "failed_requests": sum(r.failed for _, recs in runs.values() for r in recs),
           "requests": sum(len(recs) for _, recs in runs.values())}
    for model, (launched, recs) in runs.items():
        for phase, begin, end in phase_windows(phases, launched):
            if phase.users[model]:
                stats = {**phase_stats(recs, begin, end), "users": phase.users[model]}
                if plans is not None:
                    stats["expected_slowdown"] = plan_at(plans, end).get(model)
                out["phases"][phase.name]["models"][model] = stats
    return out


def of_alone(summary: dict, alone: dict) -> dict:
    """`summary` with each model's rps over `alone`'s at its users, the slowdown; per phase their sum, the worst."""
    phases = {}
    for name, body in summary["phases"].items():
        models = {}
        for model, s in body["models"].items():
            base = alone["phases"].get(alone_phase(s["users"]), {}).get("models", {}).get(model, {})
            share = ratio(s["rps"], base.get("rps"))
            models[model] = {**s, "of_alone": share, "slowdown": ratio(1.0, share)}
        shares = [m["of_alone"] for m in models.values() if m["of_alone"]]
        phases[name] = {**body, "models": models, "sum_of_alone": sum(shares) if shares else None,
                        "worst_slowdown": max(1 / x for x in shares) if shares else None}
    return {**summary, "phases": phases}


def leads(configs: dict) -> dict:
    """One round's {other config: {phase: LEAD's of-alone over its, per model ("models"), "worst", "sum"}}."""
    if LEAD not in configs:
        return {}
    out = {}
    for other, theirs in configs.items():
        if other in (LEAD, "alone"):
            continue
        out[other] = {}
        for name, body in configs[LEAD]["phases"].items():
            them = theirs["phases"][name]
            out[other][name] = {"models": {m: ratio(s["of_alone"], them["models"][m]["of_alone"])
                                           for m, s in body["models"].items()},
                                "worst": ratio(them["worst_slowdown"], body["worst_slowdown"]),
                                "sum": ratio(body["sum_of_alone"], them["sum_of_alone"])}
    return out


def normalised(configs: dict) -> dict:
    """One round's configurations (alone among them), each normalised to that round's alone, and the leads."""
    configs = {c: s if c == "alone" else of_alone(s, configs["alone"]) for c, s in configs.items()}
    return {"configs": configs, "leads": leads(configs)}


def schedule(configs: list[str], rounds: int) -> list[list[str]]:
    """Each round's order: alone, then `configs`, rotated by one a round."""
    return [round_order(["alone", *configs], r) for r in range(rounds)]


def over_all_rounds(rounds: list[dict]) -> dict:
    """The rounds' {"configs", "leads"} (as normalised gives them) as medians with spread, counts summed."""
    return over_rounds([{key: r[key] for key in ("configs", "leads")} for r in rounds], SUMMED, KEPT)
