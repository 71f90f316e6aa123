"""The front end's ceiling (`packrat bench http --ceiling`): requests a second one front-end process
answers, and its CPU time per answer, with a model of next to no cost, against the plain server
(packrat/bench/plain_server.py); then one front end against one per core (--front-ends N).
docs/serving.md ("The front end's ceiling") says how, and what `--front-ends auto` does with it."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from packrat.bench.rounds import in_rounds, median_spread, paired

CLIENT_WARMUP_S = 1.0


@dataclass(frozen=True)
class Case:
    name: str
    server: str  # packrat or plain
    front_ends: int
    cores: tuple[int, ...]  # the server's
    clients: tuple[int, ...]  # the load's


def cases(cores: Sequence[int]) -> list[Case]:
    """One front end alone on the last core (packrat, plain); then on all of them, one and one per core."""
    cores = tuple(cores)
    last, others = cores[-1:], cores[:-1] or cores
    found = [Case("packrat", "packrat", 1, last, others), Case("plain", "plain", 1, last, others)]
    if len(cores) > 1:
        found += [Case("packrat-all", "packrat", 1, cores, cores),
                  Case(f"packrat-{len(cores)}fe", "packrat", len(cores), cores, cores)]
    return found


# ---- pure: the report from plain numbers -------------------------------------------------------------

def figures(answers: int, failed: int, seconds: float, front_cpu_s: float, instances_cpu_s: float,
            latencies_ms: Sequence[float]) -> dict:
    """One case's run as figures: rps, cpu_share (front ends), instances_share, rps_per_core, p50_ms, failed."""
    return {"rps": answers / seconds, "cpu_share": front_cpu_s / seconds, "instances_share": instances_cpu_s / seconds,
            "rps_per_core": answers / front_cpu_s if front_cpu_s > 0 else None,
            "p50_ms": latencies_ms[len(latencies_ms) // 2] if latencies_ms else None, "answers": answers,
            "failed": failed}


def summarise(runs: Sequence[Mapping], names: Sequence[str]) -> dict:
    """Per case each figure's median_spread over rounds, failures summed; the paired ratios of the
    verdicts. `runs`: one {"case", "round", **figures} per load."""
    summary = {"cases": {}}
    for name in names:
        mine = [r for r in runs if r["case"] == name]
        summary["cases"][name] = {key: median_spread([r[key] for r in mine]) for key in
                                  ("rps", "cpu_share", "instances_share", "rps_per_core", "p50_ms")}
        summary["cases"][name]["failed"] = sum(r["failed"] for r in mine)

    def ratio(case: str, reference: str, key: str):
        by_round = {n: {r["round"]: r[key] for r in runs if r["case"] == n and r[key]} for n in (case, reference)}
        return median_spread(paired(by_round[case], by_round[reference]))

    summary["per_core_ratio"] = ratio("packrat", "plain", "rps_per_core")
    several = [n for n in names if n.endswith("fe")]
    summary["raise"] = ratio(several[0], "packrat-all", "rps") if several else None
    summary["verdicts"] = verdicts(summary, several[0] if several else None)
    return summary


def verdicts(summary: Mapping, several: str | None) -> list[str]:
    failed = sum(case["failed"] for case in summary["cases"].values())
    lines = []
    per_core = (summary["per_core_ratio"] or {}).get("median")
    lines.append("req/s per front-end core, packrat / plain ≥ 1: " + (
        "not measured" if per_core is None else f"{per_core:.3f}, {'met' if per_core >= 1 else 'missed'}"))
    if several:
        raised = (summary["raise"] or {}).get("median")
        lines.append(f"req/s on every core, {several} / one front end > 1: " + (
            "not measured" if raised is None else f"{raised:.3f}, {'met' if raised > 1 else 'missed'}"))
    lines.append(f"failed requests: {failed}")
    return lines


def format_report(report: Mapping) -> str:
    from packrat.bench.results import markdown_table, median_text

    rows = [[name, _cores(case["cores"]), case["front_ends"], median_text(fig["rps"], 0),
             median_text(fig["cpu_share"], 2), median_text(fig["instances_share"], 2),
             median_text(fig["rps_per_core"], 0), median_text(fig["p50_ms"], 2), fig["failed"]]
            for name, case, fig in ((n, report["cases"][n], report["summary"]["cases"][n]) for n in report["cases"])]
    ratios = [["packrat / plain, req/s per front-end core", median_text(report["summary"]["per_core_ratio"], 3)]]
    if report["summary"]["raise"]:
        ratios.append(["several front ends / one, req/s on every core", median_text(report["summary"]["raise"], 3)])
    return "\n".join([
        report["header"], "",
        markdown_table(["case", "server cores", "front ends", "req/s", "front-end CPU (cores)", "instances CPU (cores)",
                        "req/s per front-end core", "p50 ms", "failed"], rows), "",
        markdown_table(["paired per round", "median (min–max)"], ratios), "", *report["summary"]["verdicts"],
        "", "the load runs on the cores named beside each case: where it shares the server's, it takes its part"])


def _cores(cores: Sequence[int]) -> str:
    return ",".join(map(str, cores))


# ---- the measurement --------------------------------------------------------------------------------

def front_end_pids(root: int) -> tuple[list[int], list[int]]:
    """(front-end pids, their instances' pids) under `root`: a supervisor's server children, or `root`."""
    import psutil

    top = psutil.Process(root)
    fronts = [p for p in top.children() if "packrat.frontends.kserve_server" in " ".join(p.cmdline())] or [top]
    return [p.pid for p in fronts], [c.pid for p in fronts for c in p.children(recursive=True)]


def cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds so far (user + system, every thread) of the processes still there."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def load_once(case: Case, port: int, root: int, request: bytes, connections: int, seconds: float, pool) -> dict:
    """One case's closed-loop load, a client per client core; the servers' CPU read at the window's edges."""
    from packrat.bench.load_client import LoadSpec, merged, run_client

    fronts, instances = front_end_pids(root)
    start_at = time.monotonic() + 1.0  # the clients' processes are up by then
    per_client = max(1, connections // len(case.clients))
    specs = [LoadSpec("127.0.0.1", port, request, per_client, start_at, CLIENT_WARMUP_S, seconds, (core,))
             for core in case.clients]
    futures = [pool.submit(run_client, spec) for spec in specs]
    begin, end = specs[0].window
    time.sleep(max(0.0, begin - time.monotonic()))
    before = cpu_s(fronts), cpu_s(instances)
    time.sleep(max(0.0, end - time.monotonic()))
    after = cpu_s(fronts), cpu_s(instances)
    found = merged([f.result() for f in futures])
    return figures(found["answers"], found["failed"], seconds, after[0] - before[0], after[1] - before[1],
                   found["latencies_ms"])


def run(args, log) -> dict:
    """The rounds: the report (also OUT/ceiling.json); packrat's figure written for `--front-ends auto`."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from packrat.bench.load_client import http_request
    from packrat.bench.results import write_json
    from packrat.codec.payloads import v2_binary_payload
    from packrat.frontends.front_ends import write_ceiling
    from packrat.models.zoo import resolve
    from packrat.serving.default_profile import resolve_profile

    model, out = args.model, args.out
    body, content_type, length = v2_binary_payload(resolve(model))
    profile = resolve_profile(model, args.profile, batch_sizes=[args.batch_size])
    found = cases(sorted(os.sched_getaffinity(0)))
    runs = []
    with ExitStack() as stack:
        servers = {case.name: stack.enter_context(started(case, model, profile, args, out / case.name, log))
                   for case in found}
        requests = {name: http_request("127.0.0.1", port, f"/v2/models/{model}/infer", body, content_type, length)
                    for name, (port, _) in servers.items()}
        pool = stack.enter_context(ProcessPoolExecutor(max(len(c.clients) for c in found),
                                                       mp_context=multiprocessing.get_context("spawn")))
        for round_, case in in_rounds(found, args.rounds):
            log(f"-- round {round_}/{args.rounds}: {case.name}")
            port, root = servers[case.name]
            runs.append({"case": case.name, "round": round_,
                         **load_once(case, port, root, requests[case.name], args.connections, args.duration, pool)})
    summary = summarise(runs, [c.name for c in found])
    report = {"model": model, "batch": args.batch_size, "rounds": args.rounds, "duration_s": args.duration,
              "connections": args.connections, "profile": str(profile),
              "cases": {c.name: {"server": c.server, "front_ends": c.front_ends, "cores": list(c.cores),
                                 "clients": list(c.clients)} for c in found},
              "header": header(args, found), "runs": runs, "summary": summary}
    per_core = (summary["cases"]["packrat"]["rps_per_core"] or {}).get("median")
    if per_core and math.isfinite(per_core):
        report["ceiling_file"] = str(write_ceiling(per_core, {"model": model, "batch": args.batch_size}))
    report["markdown"] = format_report(report)
    write_json(out / "ceiling.json", report)
    return report


def header(args, found: Sequence[Case]) -> str:
    return (f"{args.model}, B = {args.batch_size}: the front end's ceiling; binary KServe v2 bodies from "
            f"{args.connections} kept-alive connections in a closed loop; {args.rounds} interleaved round(s) of "
            f"{args.duration:g} s per case; {len(found)} cases; figures: medians over rounds (min–max)")


def started(case: Case, model: str, profile: Path, args, run_dir: Path, log):
    """A context of the case's server: (its port, its top process's pid)."""
    from contextlib import contextmanager

    from packrat.bench.plain_server import plain_process
    from packrat.bench.servers import config_archive, kserve_serving
    from packrat.deploy.torchserve import free_port

    @contextmanager
    def serving():
        if case.server == "plain":
            port = free_port()
            with plain_process(model, run_dir, port, log=log, cores=case.cores) as (_, pid):
                yield port, pid
            return
        mar = config_archive(("ceiling", "packrat", "auto"), model, args.batch_size, profile, run_dir / "model_store",
                             max_batch_delay_ms=args.max_batch_delay)
        with kserve_serving(model, mar, run_dir, log, cores=case.cores, front_ends=case.front_ends) as server:
            yield server.http_port, server.pid

    return serving()
