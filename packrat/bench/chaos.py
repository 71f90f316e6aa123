"""Chaos and soak benchmark (issue 16): faults injected into packrat-served TorchServe under load.

    packrat bench chaos [--model resnet50] [--batch-size 4] [--duration 300] [--every 15]
                        [--faults kill,double-kill,stop,worker,reconfigure] [--json OUT]

The model served as `packrat bench` serves it, warmed up, loaded by --users closed-loop locust
users; every --every s the next fault of --faults (cycled) strikes:

  kill         kill -9 of a random pool instance
  double-kill  kill -9 of an instance, then of its replacement as soon as it appears (a respawn
               that fails while loading)
  stop         SIGSTOP of an instance for --stop-s seconds, then SIGCONT
  worker       kill -9 of a TorchServe Python worker
  reconfigure  a forced switch to the plan for B//2, B, B//2, ... in turn

Per fault: the pids hit, its recovery_s (until every worker is READY and every instance ready
again) and the failures in its window; overall: requests, failures by status and reason,
p50/p99/max, RSS after the run over after warm-up, and the processes or /dev/shm segments left
after the stop. --soak: the same load with no faults, resources sampled over time.
docs/load-testing.md says more.
"""
from __future__ import annotations

import bisect
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from packrat.bench.chaos_faults import Fault, Injector, Sampler, Tracker, reconfigure_target
from packrat.bench.harness import log
from packrat.bench.resources import shm_segments
from packrat.bench.results import fmt_num, markdown_table as markdown
from packrat.bench.servers import config_archive, warmed_server
from packrat.bench.users import by_status
from packrat.serving.default_profile import resolve_profile

if TYPE_CHECKING:  # the load test (matplotlib) is imported by the run only: `packrat --help` stays light
    from packrat.loadtest.requestlog import RequestRecord

FAULT_KINDS = ("kill", "double-kill", "stop", "worker", "reconfigure")
STOCK_FAULTS = ("worker",)  # stock TorchServe has no pool
CLIENT_TIMEOUT_SLACK_S = 60.0  # the client waits this much longer than the server's deadline
FINAL_WAIT_S = 60.0  # after warm-up and after the load, the longest wait for full strength before sampling
FIRST_REQUEST_TIMEOUT_S = 180.0  # locust imports torch and builds the payload before the first request
BEFORE_FAULTS = "before faults"


# ---- pure: schedule, attribution, summaries, tables ---------------------------------------------

def fault_schedule(kinds: Sequence[str], every_s: float, duration_s: float) -> list[tuple[float, str]]:
    """(seconds after the load started, kind) per fault: every every_s before duration_s, kinds cycled."""
    if every_s <= 0:
        raise ValueError(f"the fault interval must be > 0 s, got {every_s}")
    count = max(0, math.ceil(duration_s / every_s) - 1)
    return [((i + 1) * every_s, kinds[i % len(kinds)]) for i in range(count)] if kinds else []


def window_index(t: float, fault_times: Sequence[float]) -> int:
    """The index of the last of the sorted fault_times at or before t; -1 before the first."""
    return bisect.bisect_right(fault_times, t) - 1


def by_window(records: Iterable[RequestRecord], fault_times: Sequence[float]) -> dict[int, list[RequestRecord]]:
    """Records by fault window (-1: before the first): the first fault that struck while in flight, else
    the one it ended in, so a request stranded by a fault and given up on later is that fault's."""
    groups: dict[int, list[RequestRecord]] = {}
    for record in records:
        sent, ended = window_index(record.start, fault_times), window_index(record.end, fault_times)
        groups.setdefault(sent + 1 if ended > sent else ended, []).append(record)
    return groups


def reason_counts(records: Iterable[RequestRecord], top: int = 5) -> dict[str, int]:
    """The `top` commonest failure reasons ("STATUS: reason"), commonest first."""
    return dict(Counter(f"{r.status}: {r.reason}" for r in records if r.failed).most_common(top))


def late_count(records: Iterable[RequestRecord], deadline_s: float) -> int:
    """Requests whose answer (of any status) came later than the deadline after they were sent."""
    return sum(r.response_ms > deadline_s * 1e3 for r in records)


def summarise_kinds(faults: Sequence[Mapping], kinds: Sequence[str]) -> list[dict]:
    """Per kind that fired (`kinds` order): count, failures by status, median and max recovery_s, not recovered."""
    rows = []
    for kind in kinds:
        mine = [f for f in faults if f["kind"] == kind]
        if not mine:
            continue
        recovered = [f["recovery_s"] for f in mine if f.get("recovery_s") is not None]
        rows.append({
            "kind": kind, "count": len(mine),
            "failed": dict(sum((Counter(f.get("window_failures", {})) for f in mine), Counter()).most_common()),
            "recovery_s_median": statistics.median(recovered) if recovered else None,
            "recovery_s_max": max(recovered) if recovered else None,
            "not_recovered": len(mine) - len(recovered),
        })
    return rows


def rss_ratio(after_mb: float | None, warm_mb: float | None) -> float | None:
    return after_mb / warm_mb if after_mb is not None and warm_mb else None


def soak_rows(samples: Sequence[Mapping], records: Sequence[RequestRecord], t0: float) -> list[dict]:
    """Each resource sample with the requests and failures answered by its time."""
    ends = sorted(r.end for r in records)
    failed_ends = sorted(r.end for r in records if r.failed)
    return [{**s, "t_s": s["time"] - t0, "requests_so_far": bisect.bisect_right(ends, s["time"]),
             "failures_so_far": bisect.bisect_right(failed_ends, s["time"])} for s in samples]


def fmt_counts(counts: Mapping[str, int]) -> str:
    """{"503": 4, "0": 1} -> "4 (503: 4, no answer: 1)"; {} -> "0"."""
    total = sum(counts.values())
    if not total:
        return "0"
    parts = ", ".join(f"{'no answer' if status == '0' else status}: {n}" for status, n in counts.items())
    return f"{total} ({parts})"


def format_leftovers(left: Mapping) -> str:
    processes, segments = left.get("processes", []), left.get("segments", [])
    parts = [f"{len(processes)} process(es): " + ", ".join(f"{p['pid']} {p['what']}" for p in processes)] * bool(processes)
    parts += [f"{len(segments)} segment(s): " + ", ".join(segments)] * bool(segments)
    return "; ".join(parts) or "none"


def format_report(report: Mapping) -> str:
    """The markdown tables of a chaos or soak report (see the module docstring)."""
    load, res = report["load"], report["resources"]
    out = [f"### {report['mode']}: {report['model']}, {report['handler']} handler, B = {report['batch']}, "
           f"{report['users']} users, {report['duration_s']:g} s, payload {report['payload']}"
           + (f", a fault every {report['every_s']:g} s" if report["mode"] == "chaos" else "")
           + f" (locust on the same {report['cores']} cores)", ""]
    if report["mode"] == "chaos":
        out += [markdown(["fault", "count", "requests failed (by status)", "recovery s median", "recovery s max",
                          "not recovered"],
                         [[k["kind"], k["count"], fmt_counts(k["failed"]), fmt_num(k["recovery_s_median"]),
                           fmt_num(k["recovery_s_max"]), k["not_recovered"]] for k in report["by_kind"]]), ""]
        rows = [["-", "0.0", BEFORE_FAULTS, "", "", fmt_counts(report["before_faults"]["failed"]),
                 report["before_faults"]["requests"], ""]]
        rows += [[f["n"], fmt_num(f["offset_s"]), f["kind"], " ".join(map(str, f["pids"])),
                  fmt_num(f["recovery_s"]), fmt_counts(f["window_failures"]), f["window_requests"],
                  "; ".join(f["notes"] + [f"{k} {v:+d}" for k, v in f.get("health_delta", {}).items() if v])]
                 for f in report["faults"]]
        out += [markdown(["#", "at s", "fault", "pids hit", "recovery s", "failed in its window", "answered in it",
                          "notes"], rows), ""]
    out += [markdown(["requests", "failed (by status)", "p50 ms", "p99 ms", "max ms",
                      f"later than {report['request_timeout_s']:g} s", "RSS after / after warm-up",
                      "leftovers after stop"],
                     [[load["requests"], fmt_counts(load["failures_by_status"]), fmt_num(load["p50_ms"]),
                       fmt_num(load["p99_ms"]), fmt_num(load["max_ms"]), load["late"],
                       fmt_num(res["rss_ratio"], 3), format_leftovers(report["leftovers"])]])]
    if load["failure_reasons"]:
        out += ["", "failure reasons: " + "; ".join(f"{n}× {reason}" for reason, n in load["failure_reasons"].items())]
    if res["samples"]:
        out += ["", markdown(["t s", "RSS MB", "open fds", "workers", "instances", "/dev/shm psm_",
                              "/dev/shm packrat-", "its segments", "requests so far", "failures so far"],
                             [[fmt_num(s["t_s"], 0), fmt_num(s["rss_mb"]), fmt_num(s["fds"], 0), s["workers"],
                               s["instances"], s["shm"]["psm_"], s["shm"]["packrat-"], len(s["segments"]),
                               s["requests_so_far"], s["failures_so_far"]] for s in res["samples"]])]
    for note in report.get("notes", []):
        out += ["", f"note: {note}"]
    return "\n".join(out)


# ---- the runs ------------------------------------------------------------------------------------

def first_request_time(request_log: Path, load: Future, since: float,
                       timeout_s: float = FIRST_REQUEST_TIMEOUT_S) -> float:
    """When the load's first logged request (sent after `since`) was sent, waiting for it to be answered."""
    from packrat.loadtest.requestlog import read_request_log

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        starts = [r.start for r in read_request_log(request_log) if r.start >= since]
        if starts:
            return min(starts)
        if load.done():
            load.result()  # raises locust's error
            raise RuntimeError("locust ended before any request was answered")
        time.sleep(0.2)
    raise RuntimeError(f"no request answered within {timeout_s:.0f} s of starting locust")


def build_archive(args, run_dir: Path) -> Path:
    profile = resolve_profile(args.model, args.profile, batch_sizes=[args.batch_size, reconfigure_target(
        0, args.batch_size)]) if args.handler == "packrat" else None
    return config_archive((args.handler, args.handler, args.plan, {"request_timeout_s": args.request_timeout}),
                          args.model, args.batch_size, profile, run_dir / "model_store",
                          max_batch_delay_ms=args.max_batch_delay)


def run(args) -> dict:
    """Serve, warm up, load (with faults unless --soak), sample, stop, check leftovers: the report."""
    from packrat.codec.payloads import build_payload
    from packrat.loadtest import run_locust
    from packrat.loadtest.requestlog import read_request_log

    mode = "soak" if args.soak else "chaos"
    body = build_payload(args.model, args.payload)  # (bytes, content type), what every request sends
    users = args.users.users(args.batch_size)
    run_dir = Path(args.out) / f"{mode}-{args.handler}"
    request_log = run_dir / "requests.tsv"
    rng = random.Random(args.seed)
    mar = build_archive(args, run_dir)
    (run_dir / "logs" / "model_log.log").unlink(missing_ok=True)  # its worker pids must be this run's
    shm_before = shm_segments()
    tracker = Tracker(run_dir.resolve())  # as torchserve.Server keeps it
    sampler = Sampler(tracker, args.sample_every, log)
    faults: list[Fault] = []
    notes: list[str] = []
    schedule = [] if args.soak else fault_schedule(args.faults, args.every, args.duration)
    with warmed_server(f"{mode}/{args.handler}", args.model, mar, run_dir, users, args.warmup, log,
                       payload=body) as (server, token):
        injector = Injector(server, args.handler, args.batch_size, tracker, rng, stop_s=args.stop_s,
                            replace_wait_s=min(args.replace_wait, args.every), log=log)
        if injector.wait(injector.full_strength, time.time() + FINAL_WAIT_S)[0] is None:
            notes.append(f"not at full strength after warm-up (waited {FINAL_WAIT_S:g} s): see {run_dir / 'logs'}")
            log(f"warning: {notes[-1]}")
        warm = sampler.take("after warm-up")
        log(f"load: {users} users for {args.duration:g} s, payload {args.payload}"
            + (f", faults {','.join(args.faults)} every {args.every:g} s ({len(schedule)} in all)" if schedule else ""))
        with ThreadPoolExecutor(1) as pool, sampler:
            request_log.unlink(missing_ok=True)  # run_locust does too, but maybe after the first look below
            started = time.time()
            load = pool.submit(run_locust, server.inference_url, args.model, users, args.duration,
                               run_dir / "load", token=token, payload=body,
                               timeout_s=args.client_timeout or args.request_timeout + CLIENT_TIMEOUT_SLACK_S,
                               request_log=request_log)
            t0 = first_request_time(request_log, load, started)
            try:
                for i, (offset, kind) in enumerate(schedule):
                    time.sleep(max(0.0, t0 + offset - time.time()))
                    if load.done():
                        notes.append(f"the load ended before fault {i + 1}")
                        break
                    fault = injector.inject(i + 1, kind, t0)
                    faults.append(fault)
                    log(f"fault {fault.n} at {fault.offset_s:.1f} s: {kind} {fault.pids} {' '.join(fault.notes)}")
                    window_end = t0 + (schedule[i + 1][0] if i + 1 < len(schedule) else offset + args.every)
                    injector.wait_recovered(fault, window_end)
                    log(f"fault {fault.n} ({kind}): " + (f"recovered in {fault.recovery_s:.2f} s"
                                                        if fault.recovery_s is not None else
                                                        "not back at full strength within its window"))
            finally:
                injector.close()
            result = load.result()
        if injector.wait(injector.full_strength, time.time() + FINAL_WAIT_S)[0] is None:
            notes.append(f"not at full strength {FINAL_WAIT_S:g} s after the run, when the last sample was taken")
        after = sampler.take("after the run")
        log("stopping TorchServe")
    left = tracker.leftovers(args.grace, shm_before)
    log(f"leftovers after stop: {format_leftovers(left)}")
    return build_report(args, mode, users, result, read_request_log(request_log), t0, faults, sampler.samples,
                        warm, after, left, notes)


def build_report(args, mode: str, users: int, result, records: list[RequestRecord], t0: float,
                 faults: list[Fault], samples: list[dict], warm: dict, after: dict, left: dict,
                 notes: list[str]) -> dict:
    fault_times = [f.at for f in faults]
    windows = by_window(records, fault_times)
    fault_rows = []
    for i, fault in enumerate(faults):
        row = fault.to_json()
        row.update(window_failures=by_status(windows.get(i, []), failed_only=True), window_requests=len(windows.get(i, [])))
        if fault.caught_loading is not None:
            row["notes"] = row["notes"] + [("replacement killed while loading" if fault.caught_loading else
                                            "replacement was already serving") +
                                           f" (age {fault.replacement_age_s:.2f} s)"]
        fault_rows.append(row)
    if warm["worker_pids"] != after["worker_pids"]:
        notes.append(f"TorchServe's worker(s) {warm['worker_pids']} were replaced by {after['worker_pids']} during "
                     "the run: the RSS ratio compares different processes")
    others = sorted(set(left["new_shm_any_owner"]) - set(left["segments"]))
    if others:
        notes.append(f"{len(others)} /dev/shm segment(s) appeared during the run and outlived it that no process "
                     f"of this server owned or mapped (other processes on this machine?): {', '.join(others[:5])}")
    if len(records) != result.requests:
        notes.append(f"the request log holds {len(records)} requests, locust counted {result.requests}")
    return {
        "mode": mode, "model": args.model, "handler": args.handler, "batch": args.batch_size, "users": users,
        "duration_s": args.duration, "every_s": args.every, "faults_asked": args.faults, "payload": args.payload,
        "request_timeout_s": args.request_timeout, "client_timeout_s": args.client_timeout, "stop_s": args.stop_s, "seed": args.seed,
        "cores": psutil.cpu_count(), "first_request_at": t0,
        "load": {
            "requests": result.requests, "failures": result.failures,
            "failures_by_status": by_status(records, failed_only=True), "failure_reasons": reason_counts(records),
            "p50_ms": result.p50_ms, "p99_ms": result.p99_ms,
            "max_ms": max((r.response_ms for r in records), default=None),
            "late": late_count(records, args.request_timeout), "throughput_rps": result.throughput_rps,
        },
        "faults": fault_rows,
        "before_faults": {"failed": by_status(windows.get(-1, []), failed_only=True), "requests": len(windows.get(-1, []))},
        "by_kind": summarise_kinds(fault_rows, FAULT_KINDS),
        "resources": {"samples": soak_rows(samples, records, t0), "rss_after_warmup_mb": warm["rss_mb"],
                      "rss_after_mb": after["rss_mb"], "rss_ratio": rss_ratio(after["rss_mb"], warm["rss_mb"])},
        "leftovers": left,
        "notes": notes,
    }
