"""packrat's KServe server against the plain HTTP server a careful user writes instead, FastAPI on
uvicorn with one ONNX Runtime session (packrat/bench/plain_server.py), through HTTP on the same cores.

Both side by side on loopback, closed-loop locust users sending KServe v2 binary requests; packrat
serves as `packrat serve` does, following its load: its plan is the profile's for --batch-size, and
it switches to the plan for the batch it sees. Per users count (1, then B): both servers warmed
up at that count, packrat until it serves the plan for it, then --rounds interleaved rounds. Per
users count: each server's p50 and req/s (median, min–max), packrat's plan, and the paired ratios
packrat / plain. Verdict (issue 70): packrat's p50 ≤ 1.0× and its req/s ≥ 1.0× the plain server's,
with no failed request. Locust shares the cores with both. OUT/http-bench.json holds every figure."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

from packrat.bench.results import markdown_table, median_text
from packrat.bench.rounds import in_rounds, median_spread, paired

SERVERS = ("packrat", "plain")
P50_TARGET, RPS_TARGET = 1.0, 1.0  # packrat / plain: p50 at most, req/s at least (issue 70)
WARMUP_S = 8.0
SWITCH_WARMUPS = 6  # warm-ups at most, at a users count, for packrat to switch to its plan for that count


# ---- pure: the report from plain numbers -----------------------------------------------------------

def summarise(runs: Sequence[Mapping]) -> dict[int, dict]:
    """Per users count: each server's p50_ms and rps over rounds, counts summed, paired ratios, verdict."""
    summary = {}
    for users in sorted({r["users"] for r in runs}):
        mine = {name: [r for r in runs if r["users"] == users and r["server"] == name] for name in SERVERS}
        row = {name: {"p50_ms": median_spread([r["p50_ms"] for r in found]),
                      "rps": median_spread([r["rps"] for r in found]),
                      "requests": sum(r["requests"] for r in found), "failures": sum(r["failures"] for r in found)}
               for name, found in mine.items()}
        for figure in ("p50_ms", "rps"):
            by_round = {name: {r["round"]: r[figure] for r in found} for name, found in mine.items()}
            row[f"{figure}_ratio"] = median_spread(paired(by_round["packrat"], by_round["plain"]))
        row["verdict"] = verdict(row)
        summary[users] = row
    return summary


def verdict(row: Mapping) -> dict:
    """(met, why missed): paired p50 ≤ P50_TARGET and req/s ≥ RPS_TARGET × plain's, no failed request."""
    p50, rps = ((row.get(key) or {}).get("median") for key in ("p50_ms_ratio", "rps_ratio"))
    failures = sum(row[name]["failures"] for name in SERVERS)
    missed = []
    if p50 is None or p50 > P50_TARGET:
        missed.append("p50 not measured" if p50 is None else f"p50 {p50:.3f} > {P50_TARGET}")
    if rps is None or rps < RPS_TARGET:
        missed.append("req/s not measured" if rps is None else f"req/s {rps:.3f} < {RPS_TARGET}")
    if failures:
        missed.append(f"{failures} failed request(s)")
    return {"met": not missed, "missed": missed}


def verdict_lines(summary: Mapping[int, Mapping]) -> list[str]:
    """One line per users count: met, or missed and why."""
    targets = f"packrat / plain: p50 ≤ {P50_TARGET}, req/s ≥ {RPS_TARGET}, none failed"
    return [f"verdict at {users} user(s) ({targets}): " + ("met" if row["verdict"]["met"] else
                                                           f"missed ({'; '.join(row['verdict']['missed'])})")
            for users, row in summary.items()]


def format_report(report: Mapping) -> str:
    """The header, a row per users count and server, a row of paired ratios per users count, the verdicts."""
    summary = {int(users): row for users, row in report["summary"].items()}  # JSON made the keys strings
    rows = [[users, name, median_text(row[name]["p50_ms"], 2), median_text(row[name]["rps"], 1), row[name]["requests"],
             row[name]["failures"]] for users, row in summary.items() for name in SERVERS]
    ratios = [[users, median_text(row["p50_ms_ratio"], 3), median_text(row["rps_ratio"], 3)]
              for users, row in summary.items()]
    return "\n".join([
        report["header"], "",
        markdown_table(["users", "server", "p50 ms (min–max)", "req/s (min–max)", "requests", "failed"], rows), "",
        markdown_table(["users", "p50 packrat / plain (min–max)", "req/s packrat / plain (min–max)"], ratios),
        "", *verdict_lines(summary),
        "", "locust runs on the same cores as both servers: it takes its share from whichever is loaded"])


def header(args, cores: int, plans: Mapping, runs: Sequence[Mapping] = ()) -> str:
    served = "; ".join(f"{users} user(s): {served_plans(runs, users) or plan_text(plan)}" for users, plan in plans.items())
    return (f"{args.model}, B = {args.batch_size}, {cores} cores; packrat's KServe server following its load "
            f"({served or 'plan unknown'}; gather wait {args.max_batch_delay} ms) against FastAPI + one ONNX "
            f"Runtime session ({cores} intra-op threads); binary KServe v2 bodies; {args.rounds} interleaved "
            f"round(s) of {args.duration:g} s per server and users count after at least {args.warmup:g} s of "
            f"warm-up at that count; figures: medians over rounds; ratios: packrat / plain in the same round "
            f"(paired), median over rounds")


def served_plans(runs: Sequence[Mapping], users: int) -> str:
    """The plans packrat served at the end of its rounds at `users` users, with how many rounds each
    where they differ: the engine may have moved on after its warm-up (a trial, a correction)."""
    seen = Counter(run["plan"] for run in runs if run["server"] == "packrat" and run["users"] == users and "plan" in run)
    if len(seen) == 1:
        return next(iter(seen))
    return ", ".join(f"{plan} ({count} of {sum(seen.values())} rounds)" for plan, count in seen.most_common())


def plan_text(plan: Mapping | None) -> str:
    return " + ".join(f"⟨{i['threads']}, {i['batch']}, {i['runtime']}⟩" for i in (plan or {}).get("instances", ()))


# ---- the measurement -------------------------------------------------------------------------------

def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def round_figures(result, seconds: float) -> dict:
    """A locust run's p50 (p95, p99), req/s (as packrat.bench.users.pooled counts), requests and failures."""
    from packrat.bench.users import pooled

    return {"p50_ms": result.p50_ms, "p95_ms": result.p95_ms, "p99_ms": result.p99_ms,
            "rps": pooled([result], seconds).throughput_rps, "requests": result.requests, "failures": result.failures}


def run(args) -> dict:
    """Both servers started and warmed up, the rounds run; the report (JSON-able), also in OUT/http-bench.json."""
    import importlib.util

    from packrat.bench.plain_server import plain_serving
    from packrat.bench.results import write_json
    from packrat.bench.servers import config_archive, kserve_serving
    from packrat.codec.payloads import v2_binary_payload
    from packrat.deploy import kserve
    from packrat.deploy.torchserve import free_port
    from packrat.loadtest import run_locust
    from packrat.models.zoo import resolve
    from packrat.serving.default_profile import resolve_profile

    if importlib.util.find_spec("kserve") is None:
        raise SystemExit("packrat bench http needs the KServe SDK: pip install 'packrat-serve[kserve]'")
    model, batch, out = args.model, args.batch_size, args.out
    body, content_type, length = v2_binary_payload(resolve(model))
    profile = resolve_profile(model, args.profile, batch_sizes=[batch])
    mar = config_archive(("http", "packrat", "auto", {"reconfigure": True}), model, batch, profile, out / "model_store",
                         max_batch_delay_ms=args.max_batch_delay)

    def load(url: str, users: int, seconds: float, where: Path):
        return run_locust(url, model, users, seconds, where, payload=(body, content_type),
                          path=f"/v2/models/{model}/infer", header_length=length)

    runs, plans = [], {}
    with ExitStack() as stack:
        served = stack.enter_context(kserve_serving(model, mar, out / "packrat", log))
        urls = {"packrat": served.url,
                "plain": stack.enter_context(plain_serving(model, out / "plain", free_port(), log=log))}

        def packrat_plan() -> dict:
            return kserve.status(served)[model]["plan"]

        for users in sorted({1, batch}):
            plans[users] = warm_up(urls, packrat_plan, load, users, args, out)
            for round_, (name, _) in in_rounds([(name, users) for name in SERVERS], args.rounds):
                log(f"-- round {round_}/{args.rounds}: {name}, {users} user(s)")
                result = load(urls[name], users, args.duration, out / name / f"u{users}-r{round_}")
                served_plan = {"plan": plan_text(packrat_plan())} if name == "packrat" else {}
                runs.append({"server": name, "users": users, "round": round_, **round_figures(result, args.duration),
                             **served_plan})
    cores = len(os.sched_getaffinity(0))  # the plain server's threads; packrat plans for its CPU budget
    report = {"model": model, "batch": batch, "rounds": args.rounds, "duration_s": args.duration,
              "warmup_s": args.warmup, "max_batch_delay_ms": args.max_batch_delay, "cores": cores,
              "profile": str(profile), "plans": {str(u): p for u, p in plans.items()}, "targets": {"p50": P50_TARGET, "rps": RPS_TARGET},
              "header": header(args, cores, plans, runs), "runs": runs, "summary": summarise(runs)}
    report["markdown"] = format_report(report)
    write_json(out / "http-bench.json", report)
    return report


def warm_up(urls: Mapping[str, str], plan, load, users: int, args, out: Path) -> dict:
    """Both servers warmed up with `users` users, packrat's until `plan()` (its status) is for a
    batch of `users` (it follows its load), SWITCH_WARMUPS warm-ups at most; its plan then."""
    for name, url in urls.items():
        log(f"-- {name}: warming up, {users} user(s) for {args.warmup:g} s")
        load(url, users, args.warmup, out / name / f"warmup-u{users}")
    for attempt in range(2, SWITCH_WARMUPS + 1):
        if plan()["batch"] == users:
            break
        log(f"-- packrat serves {plan_text(plan())} for B = {plan()['batch']}: warming up again ({attempt})")
        load(urls["packrat"], users, args.warmup, out / "packrat" / f"warmup-u{users}-{attempt}")
    return plan()
