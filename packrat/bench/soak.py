"""packrat bench overload --soak (its help says what it does): steady open-loop load with bursts and kills,
the server's process tree sampled, and its verdicts; the server, warm-up and capacity runs are overload.py's."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from packrat.bench.harness import log, raise_open_files
from packrat.bench.overload import CLIENT_SLACK_S, capacity_runs, config, phase, run_dir_of, started, with_payload
from packrat.bench.overload_report import MAX_504_SHARE, health_verdict, probe_summary
from packrat.bench.resources import TreeSampler
from packrat.bench.results import Verdict, fmt_num, markdown_table
from packrat.bench.servers import HealthProbes, counter_delta, counters, status_or_none
from packrat.bench.users import admitted, answered, by_status, fmt_errors, in_windows, latencies, open_loop_users, \
    percentile, share_504, status_classes

if TYPE_CHECKING:
    from packrat.loadtest.requestlog import RequestRecord

SOAK_LOAD = 0.8  # the soak's steady rate, × capacity
SOAK_EVERY_S = 300.0  # a burst, and a kill, this often
SAMPLE_EVERY_S = 30.0
SLOPE_SHARE = 2 / 3  # the slopes are fitted over the soak's last two thirds (20 of 30 minutes)
SLOPE_SIGMAS = 2.0  # the rise allowed: this many standard errors of the slope (× the span)
KILL_WINDOW_S = 10.0  # a kill's window: from it to the deadline + this after it


# ---- pure: the schedule, the samples' phases, trends, verdicts, the report -----------------------

def soak_schedule(soak_s: float, every_s: float, burst_s: float) -> list[tuple[float, str]]:
    """(seconds from the start, "burst" or "kill") in time order: a burst every every_s ending within the soak,
    a kill half an interval before each and after the last."""
    if every_s <= 0:
        raise ValueError(f"the soak's interval must be > 0 s, got {every_s}")
    events = [(k * every_s, "burst") for k in range(1, math.floor(soak_s / every_s) + 1)
              if k * every_s + burst_s <= soak_s]
    events += [((k + 0.5) * every_s, "kill") for k in range(math.ceil(soak_s / every_s))
               if (k + 0.5) * every_s < soak_s]
    return sorted(events)


def sample_phase(t_s: float, soak_s: float, events: Sequence[tuple[float, str]], burst_s: float,
                 window_s: float) -> str:
    """What the load did at t_s: "after", "burst" (until its last deadline), "kill" (its window) or "steady".
    Only steady samples are fitted for slopes: a burst's connections and a respawning instance are no leak."""
    if t_s > soak_s:
        return "after"
    for at, kind in events:
        if at <= t_s <= at + (burst_s + window_s if kind == "burst" else window_s):
            return kind
    return "steady"


def trend(points: Sequence[tuple[float, float]]) -> dict | None:
    """The least-squares line through (t, value): slope per second, its standard error, the span of t, the mean;
    None for fewer than 3 points or a single t."""
    if len(points) < 3:
        return None
    n = len(points)
    mt, mv = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    sxx = sum((t - mt) ** 2 for t, _ in points)
    if sxx <= 0:
        return None
    slope = sum((t - mt) * (v - mv) for t, v in points) / sxx
    scatter = sum((v - mv - slope * (t - mt)) ** 2 for t, v in points)
    return {"points": n, "slope_per_s": slope, "se_per_s": math.sqrt(scatter / (n - 2) / sxx),
            "span_s": max(t for t, _ in points) - min(t for t, _ in points), "mean": mv}


RESOURCES = {  # sample key: (what, unit, the rise always allowed: one unit of resolution, in words and from the mean)
    "pss_mib": ("PSS", "MiB", "1 % of the mean", lambda mean: 0.01 * mean),
    "fds": ("open files", "", "one", lambda mean: 1.0),
    "shm_mib": ("/dev/shm", "MiB", "nothing", lambda mean: 0.0),
}


def slope_verdict(key: str, points: Sequence[tuple[float, float]]) -> Verdict:
    """Fitted rise over the span at most SLOPE_SIGMAS standard errors plus the resource's resolution."""
    what, unit, resolution, floor = RESOURCES[key]
    name = f"no upward slope: {what}"
    target = f"fitted rise ≤ {SLOPE_SIGMAS:g} × its standard error + {resolution}"
    line = trend(points)
    if line is None:
        return Verdict(name, target, False, f"{len(points)} sample(s): too few to fit a line")
    rise, noise = line["slope_per_s"] * line["span_s"], SLOPE_SIGMAS * line["se_per_s"] * line["span_s"]
    allowed = noise + floor(line["mean"])
    unit = f" {unit}" if unit else ""
    return Verdict(name, target, rise <= allowed,
                   f"{rise:+.2f}{unit} over {line['span_s'] / 60:.1f} min ({line['points']} samples, mean "
                   f"{line['mean']:.1f}{unit}): allowed {allowed:.2f}{unit}")


def soak_verdicts(counts: Mapping, outside: Mapping, inside: Mapping, kills: Sequence[Mapping], planned_kills: int,
                  samples: Sequence[Mapping], slope_from_s: float, probes: Sequence[Mapping]) -> list[Verdict]:
    """`counts` of every request, `outside` / `inside` the kill windows; slopes of steady samples from `slope_from_s`."""
    value = (f"{answered(counts) + counts['client_error']} requests: 200 {counts['200']}, 503 {counts['503']}, "
             f"504 {counts['504']}, other {counts['other']}, client errors {fmt_errors(counts)}")
    every = Verdict("every request answered", "200, 503 or 504 only, no client error",
                    answered(counts) > 0 and counts["other"] == 0 and counts["client_error"] == 0, value)
    share_out, share_in = share_504(outside), share_504(inside)
    rare = Verdict("504 rare outside kills", f"504 ≤ {MAX_504_SHARE:.0%} of the admitted outside the kill windows",
                   share_out is not None and share_out <= MAX_504_SHARE,
                   (f"{outside['504']} = {share_out:.2%} of {admitted(outside)} admitted outside"
                    if share_out is not None else "nothing admitted outside the kill windows")
                   + (f"; inside: {inside['504']} = {share_in:.1%} of {admitted(inside)}"
                      if share_in is not None else ""))
    struck = sum(1 for k in kills if k.get("pid"))
    killed = Verdict("instances killed", "each planned kill struck a pool instance process",
                     struck == planned_kills and planned_kills > 0,
                     f"{struck} of {planned_kills} kills struck" + ("" if struck == planned_kills else
                                                                   " (no instance process found: thread instances? "
                                                                   "--instance-kind process)"))
    window = [s for s in samples if s["t_s"] >= slope_from_s and s.get("phase", "steady") == "steady"]
    slopes = [slope_verdict(key, [(s["t_s"], s[key]) for s in window if s.get(key) is not None]) for key in RESOURCES]
    return [every, rare, killed, *slopes, health_verdict(probes)]


def event_figures(event: Mapping, records: Sequence[RequestRecord], burst_s: float, window_s: float) -> dict:
    """A burst's requests (every stream's) or a kill's (in flight or sent in its window); a burst's 200s per second."""
    start = event["time"]
    end = start + (burst_s if event["kind"] == "burst" else window_s)
    mine = ([r for r in records if start <= r.start < end] if event["kind"] == "burst"
            else [r for r in records if in_windows(r, [(start, end)])])
    figures = {"sent": len(mine), "counts": status_classes(mine)}
    if event["kind"] == "burst":
        figures["served_rps"] = sum(r.status == 200 and not r.client_error for r in mine) / burst_s
    return figures


def format_soak_report(report: Mapping) -> str:
    """The soak's header, its bursts and kills, the resource samples and the verdicts."""
    cap, counts = report["capacity"], report["counts"]
    out = [f"### soak: {report['model']} on {report['engine']}, B = {report['batch']}, payload {report['payload']}, "
           f"deadline {report['request_timeout_s']:g} s; {report['soak_s'] / 60:g} min at {SOAK_LOAD:g} × capacity "
           f"{fmt_num(cap['rps'])} req/s ({cap['users']} users, of "
           f"{' / '.join(fmt_num(c['rps']) for c in report['capacity_runs'])} req/s), a burst to "
           f"{report['factor']:g}× for {report['duration_s']:g} s and a kill every {report['every_s']:g} s"
           + (", slowed" if report["slow"] else "") + f" (locust on the same {report['cores']} cores)", "",
           markdown_table(["requests", "200", "503", "504", "other", "client errors", "504 of admitted outside kills",
                           "inside kills", "200 p50/p99 ms"],
                          [[report["sent"], counts["200"], counts["503"], counts["504"], counts["other"],
                            fmt_errors(counts), _share(report["outside_kills"]), _share(report["inside_kills"]),
                            f"{fmt_num(report['p50_200_ms'])}/{fmt_num(report['p99_200_ms'])}"]]), ""]
    if report["events"]:
        out += [markdown_table(["at s", "event", "pid", "sent", "200", "503", "504", "other", "client errors", "200/s"],
                               [[fmt_num(e["at_s"], 0), e["kind"], e.get("pid") or "-", e["sent"], e["counts"]["200"],
                                 e["counts"]["503"], e["counts"]["504"], e["counts"]["other"], fmt_errors(e["counts"]),
                                 fmt_num(e.get("served_rps"))] for e in report["events"]]), ""]
    if report["samples"]:
        out += [markdown_table(["t s", "load", "PSS MiB", "open files", "/dev/shm MiB", "segments", "processes"],
                               [[fmt_num(s["t_s"], 0), s.get("phase", "-"), fmt_num(s["pss_mib"]),
                                 fmt_num(s["fds"], 0), fmt_num(s["shm_mib"], 2), s["segments"], s["processes"]]
                                for s in report["samples"]]), ""]
    out += [f"- {Verdict(**v).line()}" for v in report["verdicts"]]
    out += [f"\nnote: {note}" for note in report["notes"]]
    return "\n".join(out)


def _share(counts: Mapping) -> str:
    share = share_504(counts)
    return "-" if share is None else f"{share:.2%} of {admitted(counts)}"


# ---- the run -------------------------------------------------------------------------------------

def run_soak(args) -> dict:
    """Serve, warm up, capacity, then the soak (steady load, bursts, kills, samples, probes): the report."""
    from packrat.bench.faults import kill_one
    from packrat.loadtest.requestlog import read_request_log

    args = with_payload(args)
    run_dir = run_dir_of(args)
    open_files = raise_open_files()
    soak_s, every_s = args.soak * 60.0, args.soak_every
    client_timeout_s = args.request_timeout_s + CLIENT_SLACK_S
    window_s = args.request_timeout_s + KILL_WINDOW_S
    notes: list[str] = []
    events: list[dict] = []
    streams: list[tuple[str, Path]] = []
    with started(args, run_dir, notes) as (target, body, start, slow_cores):
        health = {"start": counters(status_or_none(target, notes, "before the soak"))}
        runs, best = capacity_runs(target, args, body, run_dir)
        capacity = runs[best]["rps"]
        rate, burst_rate = SOAK_LOAD * capacity, max(args.factor - SOAK_LOAD, 0.0) * capacity
        users, burst_users = (open_loop_users(r, args.request_timeout_s, args.batch_size) for r in (rate, burst_rate))
        if users + burst_users + 100 > open_files:
            notes.append(f"{users} + {burst_users} open-loop users near the open-file limit ({open_files})")
        schedule = soak_schedule(soak_s, every_s, args.duration)
        probes: list[dict] = []
        if capacity <= 0:
            notes.append(f"no answer 200 in the capacity runs: no soak (see the server's log: {target.logs})")
            schedule = []
        with ThreadPoolExecutor(max_workers=2) as pool, TreeSampler(target.root_pid, args.sample_every) as sampler, \
                HealthProbes(target) as prober:
            t0 = time.time()
            if capacity > 0:
                log(f"soak: {rate:.1f} req/s ({SOAK_LOAD:g} × {capacity:.1f}) from {users} users for "
                    f"{soak_s:g} s; {len(schedule)} events: "
                    + ", ".join(f"{kind} at {at:g} s" for at, kind in schedule))
                steady = pool.submit(phase, target, args.model, users, soak_s, run_dir / "soak", body,
                                     client_timeout_s, rate)
                streams.append(("soak", run_dir / "soak" / "requests.tsv"))
                bursts = []
                for at, kind in schedule:
                    time.sleep(max(0.0, t0 + at - time.time()))
                    event = {"at_s": at, "kind": kind, "time": time.time()}
                    if kind == "burst":
                        where = run_dir / f"burst{len(bursts) + 1}"
                        log(f"burst at {at:g} s: {burst_rate:.1f} req/s more from {burst_users} users for "
                            f"{args.duration:g} s")
                        bursts.append(pool.submit(phase, target, args.model, burst_users, args.duration, where, body,
                                                  client_timeout_s, burst_rate))
                        streams.append((where.name, where / "requests.tsv"))
                    else:
                        root = target.root_pid()
                        event["pid"] = kill_one(root, skip={e["pid"] for e in events if e.get("pid")}) if root else None
                        log(f"kill at {at:g} s: " + (f"instance {event['pid']} killed" if event["pid"]
                                                     else "no instance process found"))
                    events.append(event)
                steady.result()
                for burst in bursts:
                    burst.result()
            probes = prober.probes
            sampler.take()
        health["end"] = counters(status_or_none(target, notes, "after the soak"))
    records = [r for _, path in streams for r in read_request_log(path)]
    kill_windows = [(e["time"], e["time"] + window_s) for e in events if e["kind"] == "kill"]
    inside = [r for r in records if in_windows(r, kill_windows)]
    outside = [r for r in records if not in_windows(r, kill_windows)]
    samples = [{**s, "t_s": s["time"] - t0,
                "phase": sample_phase(s["time"] - t0, soak_s, schedule, args.duration, window_s)}
               for s in sampler.samples]
    planned = sum(kind == "kill" for _, kind in schedule)
    found = soak_verdicts(status_classes(records), status_classes(outside), status_classes(inside),
                          [e for e in events if e["kind"] == "kill"], planned, samples, soak_s * (1 - SLOPE_SHARE),
                          probes)
    for verdict in found:
        log(verdict.line())
    ok = latencies(records, 200)
    return {**config(args, args.payload, slow_cores, (start or {}).get("plan"), run_dir), "soak_s": soak_s,
            "every_s": every_s, "sample_every_s": args.sample_every, "capacity_runs": runs,
            "capacity": runs[best], "rate_rps": rate, "users": users, "burst_rate_rps": burst_rate,
            "burst_users": burst_users, "sent": len(records), "counts": status_classes(records),
            "by_status": by_status(records), "outside_kills": status_classes(outside),
            "inside_kills": status_classes(inside), "kill_window_s": window_s,
            "p50_200_ms": percentile(ok, 0.50), "p99_200_ms": percentile(ok, 0.99),
            "events": [{**e, **event_figures(e, records, args.duration, window_s)} for e in events],
            "samples": samples, "slope_from_s": soak_s * (1 - SLOPE_SHARE), "probes": probe_summary(probes),
            "health": {**health, "delta": counter_delta(health["start"], health["end"])},
            "verdicts": [asdict(v) for v in found], "passed": all(v.passed for v in found), "notes": notes}
