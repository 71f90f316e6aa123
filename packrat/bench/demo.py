"""What `packrat demo` chooses and says: its model, grid and load, the three servers it compares
(stock TorchServe as a user runs it, a careful user's one-session handler, packrat's plan), what
the table shows against each, and what splitting the cores gives on a bigger machine."""

from __future__ import annotations

from pathlib import Path

from packrat.bench.server import ServerRun
from packrat.bench.users import BATCH_USERS
from packrat.models.modes import DEFAULT_MODE
from packrat.models.runtimes import DEFAULT_RUNTIME, base_runtime
from packrat.planning.planner import Plan
from packrat.profiling.profiles import Profile, default_path as default_profile_path

DEMO_MODEL = "squeezenet"  # light, where the runtime matters most on a small machine; quick to profile
DEMO_GRAPH_MODE = "eager"  # inductor's as stock runs it: compiling cold costs more than the demo has
DEMO_BATCHES = [4, 8]  # B = 8 and its halves: the plan may split it, fat or not
DEMO_MIN_TIME_S = 0.5  # runtimes 5-15 % apart are told apart; a point's process start costs more
DEMO_SERVE_BATCH = 8  # the largest profiled: B users keep every batch full, so a round is B-request batches
DEMO_USERS = [BATCH_USERS]  # closed loop: every batch full, each server busy, a request's latency one batch's
DEMO_ROUNDS = 3
DEMO_DURATION_S = 8.0
DEMO_WARMUP_S = 3.0
# The targets of a win on the user's machine (issue 55): against stock, and level with the careful user.
WIN_P50, WIN_RPS, LEVEL_P50 = 0.90, 1.10, 1.02
# Where the Packrat authors' published 16-core tables may lie (the demo reads them, never ships them).
PUBLISHED_TABLES = (Path("../shared/reference-profiles/resnet_large-batches.csv"),)
AT_SCALE_THREADS, AT_SCALE_BATCHES = 16, (8, 32, 128)


def demo_profile_path(model: str, graph_mode: str) -> Path:
    """profiles/MODEL.csv in the default mode, else profiles/MODE-MODEL.csv: a profile holds one mode."""
    return default_profile_path(model, "" if graph_mode == DEFAULT_MODE else f"{graph_mode}-")


def careful_runtime(profile: Profile, threads: int, batch: int) -> str:
    """What a careful user runs one session of: the profile's fastest at ⟨threads, batch⟩, in-process."""
    return base_runtime(profile.runtimes.get((threads, batch), DEFAULT_RUNTIME))


def demo_configs(careful: str, graph_mode: str) -> tuple:
    """(name, handler, plan mode, settings): stock TorchServe on the eager model, one `careful` session, packrat."""
    return (("stock", "stock", "auto", {"graph_mode": "eager"}),
            ("careful", "careful", "auto", {"runtime": careful, "graph_mode": graph_mode}),
            ("packrat", "packrat", "auto"))


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "-"


def verdict(runs: list[ServerRun], careful: str) -> list[str]:
    """Plain sentences of what the table shows: packrat against stock, then against the careful user."""
    by_config = {r.config: r.load for r in runs}
    stock, user, planned = by_config["stock"], by_config["careful"], by_config["packrat"]
    p50, rps, level = planned.p50_ms / stock.p50_ms, planned.throughput_rps / stock.throughput_rps, \
        planned.p50_ms / user.p50_ms
    won = p50 <= WIN_P50 and rps >= WIN_RPS
    lines = [f"Against stock TorchServe (its handler running the eager model): packrat's p50 was "
             f"{ratio(planned.p50_ms, stock.p50_ms)} stock's and it answered "
             f"{ratio(planned.throughput_rps, stock.throughput_rps)} its requests per second: "
             + ("lower latency and more throughput from the same cores." if won else
                f"short of the win it aims for (p50 ≤ {WIN_P50:.2f}×, req/s ≥ {WIN_RPS:.2f}×) this time.")]
    lines.append(f"Against a careful user's handler (one {careful} session on every core, decoding in parallel; "
                 f"the fastest runtime the profile found): packrat's p50 was {ratio(planned.p50_ms, user.p50_ms)} its; "
                 + ("level or ahead." if level <= LEVEL_P50 else
                    f"behind by more than {LEVEL_P50 - 1:.0%}: on this machine that handler is the better choice."))
    return lines


def at_scale_lines(published: Profile, plans: list[Plan], source: Path) -> list[str]:
    """What splitting the cores gives on 16 cores, planned on a published table: predicted, not measured here."""
    lines = [f"On a bigger machine, planned on the published table {source} "
             f"({published.metadata.get('model', '?')}, {published.metadata.get('source', 'published')}; "
             "the plan's prediction, not a measurement on this machine):"]
    for plan in plans:
        lines.append(f"  T={plan.threads}, B={plan.batch}: {plan.describe()} {plan.expected_latency_ms:.0f} ms "
                     f"against {plan.fat_latency_ms:.0f} ms for one fat instance ({plan.speedup:.2f}×)")
    return lines


def published_table(given: Path | None) -> Path | None:
    """The published 16-core table to plan on: `given`, else the first of PUBLISHED_TABLES that exists."""
    if given is not None:
        return given
    return next((path for path in PUBLISHED_TABLES if path.exists()), None)
