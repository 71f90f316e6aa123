"""packrat bench overload's report (overload.py runs it), pure: each phase's summary, the verdicts per run
and over the runs against issues 56 and 64's targets, the probes' summary, and the table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from packrat.bench.resources import cost_line
from packrat.bench.results import Verdict, fmt_num, markdown_table
from packrat.bench.users import admitted, answered, answered_within, by_status, fmt_errors, latencies, percentile, \
    run_seconds, sent_within, share_504, status_classes

if TYPE_CHECKING:
    from packrat.loadtest.requestlog import RequestRecord

MAX_504_SHARE = 0.01  # of the admitted
MIN_SERVED_RATIO = 0.85  # answers 200 per second under overload over capacity
MAX_503_P99_MS = 50.0
MAX_AFTER_RATIO = 1.1  # p50 after over p50 before
MAX_HEALTH_MS = 1000.0  # a liveness or readiness probe's answer, at most


# ---- the phases ----------------------------------------------------------------------------------

def closed_summary(records: Sequence[RequestRecord], duration_s: float, users: int) -> dict:
    """A closed-loop phase: requests, by status, client errors, 200s per second (capacity), p50/p99."""
    seconds = run_seconds(duration_s)
    ok = latencies(records, 200)
    return {"users": users, "seconds": seconds, "requests": len(records), "by_status": by_status(records),
            "client_errors": status_classes(records)["errors"],
            "rps": answered_within(records, seconds) / seconds,
            "p50_ms": percentile(ok, 0.50), "p99_ms": percentile(ok, 0.99)}


def best_capacity(runs: Sequence[Mapping]) -> int:
    """The index of the capacity run with the most 200s per second (on a tie fewer users); -1 for none."""
    best = -1
    for i, run in enumerate(runs):
        if best < 0 or run["rps"] > runs[best]["rps"] or (run["rps"] == runs[best]["rps"]
                                                           and run["users"] < runs[best]["users"]):
            best = i
    return best


def overload_summary(records: Sequence[RequestRecord], duration_s: float, capacity_rps: float | None,
                     rate_rps: float, users: int) -> dict:
    """The open-loop phase: offered, sent, counts, 200s per second over capacity, 503 and 200 p50/p99, and
    the 504s' share of the admitted."""
    seconds = run_seconds(duration_s)
    counts = status_classes(records)
    served = answered_within(records, seconds) / seconds
    refused, ok = latencies(records, 503), latencies(records, 200)
    return {"rate_rps": rate_rps, "users": users, "seconds": seconds, "sent": len(records),
            "sent_rps": sent_within(records, seconds) / seconds, "counts": counts, "by_status": by_status(records),
            "admitted": admitted(counts), "share_504": share_504(counts), "served_rps": served,
            "served_ratio": served / capacity_rps if capacity_rps else None,
            "p50_503_ms": percentile(refused, 0.50), "p99_503_ms": percentile(refused, 0.99),
            "p50_200_ms": percentile(ok, 0.50), "p99_200_ms": percentile(ok, 0.99)}


def closed_notes(name: str, closed: Mapping) -> list[str]:
    failed = closed["requests"] - closed["by_status"].get("200", 0)
    return ([f"the {name} run had {failed} of {closed['requests']} requests not answered 200 "
             f"({', '.join(f'{s}: {n}' for s, n in closed['by_status'].items() if s != '200')}"
             + (f"; client errors {closed['client_errors']}" if closed.get("client_errors") else "") + ")"]
            if failed else [])


# ---- the verdicts --------------------------------------------------------------------------------

def statuses_verdict(counts: Mapping, name: str = "only 200 or 503") -> Verdict:
    """504s at most 1 % of the admitted, no other status, no client error (named by class); none answered fails."""
    target = f"504 ≤ {MAX_504_SHARE:.0%} of the admitted, no other status, no client error"
    sent = answered(counts) + counts["client_error"]
    if answered(counts) == 0:
        return Verdict(name, target, False,
                       f"no request was answered ({sent} sent, client errors: {fmt_errors(counts)})" if sent
                       else "no request was sent")
    share = share_504(counts)
    passed = counts["other"] == 0 and counts["client_error"] == 0 and (share or 0.0) <= MAX_504_SHARE
    value = (f"504: {counts['504']} = {share:.1%} of {admitted(counts)} admitted" if share is not None
             else "nothing admitted") + f", other: {counts['other']}, client errors: {fmt_errors(counts)}"
    return Verdict(name, target, passed, value)


def served_verdict(served_rps: float | None, capacity_rps: float | None) -> Verdict:
    """Answers 200 per second under overload at least 0.85 × capacity."""
    target = f"≥ {MIN_SERVED_RATIO:g} × capacity"
    if not capacity_rps:
        return Verdict("served", target, False, "no capacity measured")
    share = (served_rps or 0.0) / capacity_rps
    return Verdict("served", target, share >= MIN_SERVED_RATIO,
                   f"{fmt_num(served_rps or 0.0)} req/s of 200 = {share:.2f} × capacity {fmt_num(capacity_rps)}")


def refusals_verdict(p99_503_ms: float | None, counts: Mapping) -> Verdict:
    """The 503s' p99 at most 50 ms; no 503 passes (said so) when something was answered."""
    target = f"503 p99 ≤ {MAX_503_P99_MS:g} ms"
    if not answered(counts):
        return Verdict("refused fast", target, False, "no request was answered")
    if not counts["503"]:
        return Verdict("refused fast", target, True, "no 503s")
    if p99_503_ms is None:
        return Verdict("refused fast", target, False, f"{counts['503']} 503s without latencies")
    return Verdict("refused fast", target, p99_503_ms <= MAX_503_P99_MS,
                   f"503 p99 {fmt_num(p99_503_ms)} ms over {counts['503']} 503s")


def recovery_verdict(before_p50_ms: float | None, after_p50_ms: float | None) -> Verdict:
    """p50 after the overload at most 1.1 × p50 before."""
    target = f"after p50 ≤ {MAX_AFTER_RATIO:g} × before p50"
    if not before_p50_ms or after_p50_ms is None:
        return Verdict("recovered", target, False,
                       f"no p50 {'before' if not before_p50_ms else 'after'} (no answer 200)")
    share = after_p50_ms / before_p50_ms
    return Verdict("recovered", target, share <= MAX_AFTER_RATIO,
                   f"p50 {fmt_num(after_p50_ms)} ms after, {fmt_num(before_p50_ms)} ms before: {share:.2f}×")


def probe_summary(probes: Sequence[Mapping]) -> dict:
    """Health probes per path: how many, by status (0: no answer, with its class), p50, p99, max ms, over 1 s."""
    out: dict[str, dict] = {}
    for path in dict.fromkeys(p["path"] for p in probes):
        mine = [p for p in probes if p["path"] == path]
        ms = [p["ms"] for p in mine]
        out[path] = {"probes": len(mine),
                     "by_status": dict(Counter(str(p["status"]) + (f" {p['error']}" if p.get("error") else "")
                                               for p in mine).most_common()),
                     "p50_ms": percentile(ms, 0.50), "p99_ms": percentile(ms, 0.99), "max_ms": max(ms),
                     "late": sum(m > MAX_HEALTH_MS for m in ms)}
    return out


def health_verdict(probes: Sequence[Mapping]) -> Verdict:
    """Every liveness and readiness probe answered 200 within 1 s; no probe at all fails."""
    target = f"liveness and readiness answered 200 within {MAX_HEALTH_MS / 1e3:g} s"
    if not probes:
        return Verdict("health in time", target, False, "no probe was made")
    late = [p for p in probes if p["ms"] > MAX_HEALTH_MS]
    wrong = [p for p in probes if p["status"] != 200]
    slowest = max(probes, key=lambda p: p["ms"])
    value = (f"{len(probes)} probes of {', '.join(dict.fromkeys(p['path'] for p in probes))}: slowest "
             f"{fmt_num(slowest['ms'])} ms ({slowest['path']}), {len(late)} over {MAX_HEALTH_MS:g} ms, "
             f"{len(wrong)} not 200")
    if wrong:
        value += " (" + ", ".join(f"{k}: {v}" for k, v in Counter(
            f"{p['path']} {p['status']}" + (f" {p['error']}" if p.get("error") else "") for p in wrong).items()) + ")"
    return Verdict("health in time", target, not late and not wrong, value)


def verdicts(before: Mapping, overload: Mapping, after: Mapping,
             probes: Sequence[Mapping] | None = None) -> list[Verdict]:
    """A run's verdicts from its phases' summaries and probes (None: no health verdict)."""
    found = [statuses_verdict(overload["counts"]), served_verdict(overload["served_rps"], before["rps"]),
             refusals_verdict(overload["p99_503_ms"], overload["counts"]),
             recovery_verdict(before["p50_ms"], after["p50_ms"])]
    return found + ([health_verdict(probes)] if probes is not None else [])


def overall_verdicts(runs: Sequence[Sequence[Mapping]]) -> list[Verdict]:
    """Each verdict (by name, in the first run's order) passed in every run: "k of N runs"."""
    names = list(dict.fromkeys(v["name"] for found in runs for v in found))
    out = []
    for name in names:
        mine = [v for found in runs for v in found if v["name"] == name]
        failed = [i + 1 for i, found in enumerate(runs) if any(v["name"] == name and not v["passed"] for v in found)]
        passed = len(mine) - len(failed)
        value = f"{passed} of {len(runs)} runs" + (f" (failed: run {', '.join(map(str, failed))})" if failed else "")
        out.append(Verdict(name, f"{mine[0]['target']}, in every run", not failed and len(mine) == len(runs), value))
    return out


# ---- the table -----------------------------------------------------------------------------------

TABLE_HEAD = ["run", "engine", "admission", "slow", "B / 2B req/s", "users", "capacity req/s", "before p50 ms",
              "offered req/s", "sent req/s", "sent", "200", "503", "504", "other", "client errors", "200/s",
              "÷ capacity", "503 p50/p99 ms", "200 p50/p99 ms", "504 of admitted", "health max ms",
              "after p50 ms", "after / before"]


def table_row(report: Mapping, run: Mapping) -> list:
    before, over, after = run["before"], run["overload"], run["after"]
    counts, share = over["counts"], over["share_504"]
    engine = report["engine"] + (" (process instances)" if report.get("instance_kind") == "process" else "")
    probes = run.get("probes") or {}
    return [run.get("run", 1), engine, report["admission"], "yes" if report["slow"] else "no",
            " / ".join(fmt_num(c["rps"]) for c in run.get("capacity_runs", [before])), before["users"],
            fmt_num(before["rps"]), fmt_num(before["p50_ms"]), fmt_num(over["rate_rps"]), fmt_num(over["sent_rps"]),
            over["sent"], counts["200"], counts["503"], counts["504"], counts["other"], fmt_errors(counts),
            fmt_num(over["served_rps"]), fmt_num(over["served_ratio"], 2),
            f"{fmt_num(over['p50_503_ms'])}/{fmt_num(over['p99_503_ms'])}",
            f"{fmt_num(over['p50_200_ms'])}/{fmt_num(over['p99_200_ms'])}",
            "-" if share is None else f"{share:.1%}",
            fmt_num(max((p["max_ms"] for p in probes.values()), default=None)), fmt_num(after["p50_ms"]),
            fmt_num(run["after_over_before"], 2)]


def format_table(report: Mapping) -> str:
    """One row per run."""
    return markdown_table(TABLE_HEAD, [table_row(report, run) for run in report["runs"]])


def format_report(report: Mapping) -> str:
    """The header, a row per run, each run's counters, CPU and verdicts, then the verdicts over all runs."""
    first = report["runs"][0]
    queue = report["max_queue"] if report["max_queue"] is not None else f"{report['default_max_queue']} (default)"
    out = [f"### overload: {report['model']}, B = {report['batch']}, payload {report['payload']}, deadline "
           f"{report['request_timeout_s']:g} s, max_queue {queue}; {len(report['runs'])} run(s) of "
           f"{report['factor']:g}× capacity for {first['overload']['seconds']} s, capacity the best over "
           f"{first['before']['seconds']} s of {' or '.join(str(c['users']) for c in first.get('capacity_runs', []))}"
           f" users; {first['overload']['users']} open-loop users"
           + (f"; slowed by {len(report['slow_cores'])} CPU-bound process(es) on cores "
              f"{','.join(map(str, report['slow_cores']))}" if report["slow"] else "")
           + f" (locust on the same {report['cores']} cores)", "", format_table(report), ""]
    for run in report["runs"]:
        out.append(f"run {run['run']}:")
        delta = run["health"].get("overload_delta") or {}
        if delta:
            out.append("server counters over the overload: " + ", ".join(f"{k} {v:+d}" for k, v in delta.items() if v)
                       + (f"; predicted_wait_ms at its end: {fmt_num(run['health']['overload'].get('predicted_wait_ms'))}"
                          if "predicted_wait_ms" in run["health"].get("overload", {}) else ""))
        if run.get("cpu"):
            out.append(cost_line(run["cpu"]))
        out += [f"- {Verdict(**v).line()}" for v in run["verdicts"]]
        out += [f"note: {note}" for note in run["notes"]]
        out.append("")
    if len(report["runs"]) > 1:
        out += [f"over {len(report['runs'])} runs:"] + [f"- {Verdict(**v).line()}" for v in report["verdicts"]] + [""]
    out += [f"note: {note}" for note in report["notes"]]
    return "\n".join(out).rstrip("\n")
