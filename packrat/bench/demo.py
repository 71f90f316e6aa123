"""What `packrat demo` chooses and says: its model, grid and load, the batch it serves (the largest
whose plan splits the cores), why a plan keeps one instance, and what the served table shows."""

from __future__ import annotations

from pathlib import Path

from packrat.bench.server import ServerRun
from packrat.bench.users import BATCH_USERS
from packrat.models.modes import DEFAULT_MODE
from packrat.planning.planner import Plan
from packrat.profiling.profiles import Profile, default_path as default_profile_path

# Where splitting the cores pays even on two of them (docs/benchmarks/demo.md, "Why BERT, and why eager").
DEMO_MODEL = "bert_base"
# Eager: on 2 cores, compiling BERT's packages for one thread count (batches 4, 2, 1) took 68 s,
# and compile mode needs them for every thread count and batch size: longer than the whole eager
# profile. All three servers run the same mode, so the comparison is of how the cores are used.
DEMO_GRAPH_MODE = "eager"
DEMO_BATCHES = [1, 2, 4, 8]
# B users in a closed loop: every batch full, the next one sent as soon as it is answered, so each
# server is busy all the time and a request's latency is one batch's. (2B would let stock's two
# workers run two batches at once, a split of its own, and double every latency.)
DEMO_USERS = [BATCH_USERS]
DEMO_ROUNDS = 3
DEMO_DURATION_S = 12.0
DEMO_WARMUP_S = 4.0  # a few batches: eager instances have nothing to compile


def demo_profile_path(model: str, graph_mode: str) -> Path:
    """profiles/MODEL.csv in the default mode (the profile serve, archive and bench use), else
    profiles/MODE-MODEL.csv: a profile holds one mode, and an eager one must not replace it."""
    return default_profile_path(model, "" if graph_mode == DEFAULT_MODE else f"{graph_mode}-")


def splits(plan: Plan) -> bool:
    return len(plan.instances) > 1


def showcase_batch(plans: list[Plan]) -> int:
    """The largest batch whose plan splits the cores (the largest of all if none does)."""
    split = [p.batch for p in plans if splits(p)]
    return max(split or [p.batch for p in plans])


def why_not_split(profile: Profile, plan: Plan) -> str:
    """Why the plan for one batch keeps one instance, from the profile: halves are slower."""
    if plan.batch == 1:
        return "B=1: one request cannot be split"
    halves = profile.latency.get((plan.threads // 2, plan.batch // 2))
    if plan.threads < 2 or plan.batch % 2 or halves is None:
        return f"B={plan.batch}: no split of the profiled points is faster"
    return (f"B={plan.batch}: halves, 2×⟨{plan.threads // 2} threads, batch {plan.batch // 2}⟩, would take "
            f"{halves:.0f} ms against {plan.expected_latency_ms:.0f} ms for {plan.describe()}")


def print_where_fat(profile: Profile, plans: list[Plan]) -> None:
    kept = [p for p in plans if not splits(p)]
    if not kept:
        print("The plan splits the cores at every profiled batch.")
        return
    print(f"Where the plan keeps one instance (B={', '.join(str(p.batch) for p in kept)}), the profile predicts "
          "no gain from splitting the cores:")
    for plan in kept:
        print(f"  {why_not_split(profile, plan)}")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "-"


def print_verdict(runs: list[ServerRun], plan: Plan) -> None:
    """A plain sentence of what the table shows: the plan against fat and stock under the same load."""
    by_config = {r.config: r.load for r in runs}
    stock, fat, planned = by_config["stock"], by_config["packrat-fat"], by_config["packrat-plan"]
    if not splits(plan):
        print(f"\nAt B={plan.batch} the plan keeps one instance on this machine, so packrat plan = packrat fat "
              "here and the table shows packrat's own cost against stock; the plan table above shows where it "
              "splits the cores (--serve-batch).")
        return
    won = planned.p50_ms < fat.p50_ms and planned.throughput_rps > fat.throughput_rps
    print(f"\nWhat it shows: at B={plan.batch} the plan splits the {plan.threads} cores into {plan.describe()}, "
          f"predicted {plan.expected_latency_ms:.0f} ms a batch against {plan.fat_latency_ms:.0f} ms for fat "
          f"⟨{plan.threads} threads, batch {plan.batch}⟩. Under the same load ({runs[0].users} closed-loop users, "
          f"{runs[0].rounds} rounds) its p50 was {ratio(planned.p50_ms, fat.p50_ms)} fat's and its p99 "
          f"{ratio(planned.p99_ms, fat.p99_ms)}, and it answered {ratio(planned.throughput_rps, fat.throughput_rps)} "
          f"fat's requests per second ({ratio(planned.throughput_rps, stock.throughput_rps)} stock's): "
          + ("lower latency and more throughput from the same cores, the win packrat is for." if won else
             "not a clear win this time; on a busy machine a gap under 10 % drowns in the noise: try more --rounds."))

