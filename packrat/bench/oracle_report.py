"""The oracle's report (packrat bench oracle; oracle.py measures), pure: per B the best configuration and
the planner's choices as paired ratios to it, the verdicts, the table; runs merged, or rescored."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from packrat.bench.harness import local_topology
from packrat.bench.oracle_configs import IDENTICAL_TEXT, planner_choice
from packrat.bench.results import markdown_table, with_spread
from packrat.bench.rounds import paired
from packrat.profiling.profiles import load
from packrat.serving.payloads import planned_for

PLAN_TOLERANCE = 0.03  # target: the loaded plan's measured latency within 3 % of the oracle's
PREDICTION_TOLERANCE = 0.10  # target: the loaded plan's prediction within 10 % of its measured latency


def by_round(config: dict) -> dict[tuple[int, int], float]:
    """A timed configuration's figure in each (group, round) it ran in (none in files from before rounds were kept)."""
    return {tuple(key): ms for key, ms in zip(config.get("sample_rounds", []), config["samples_ms"])}


def summarize_batch(entry: dict) -> dict:
    """The oracle and the planner's choices for one B as ratios: a choice over the best paired per round
    (median, min–max), or the ratio of their medians where no rounds were kept."""
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
    """Whether `value` (vs_best or predicted_vs_measured) meets its target; an unmeasured one does not."""
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


def paired_text(row: dict, key: str) -> str:
    """A ratio, with its rounds' min–max where it was paired."""
    return with_spread(row.get(key), row.get(f"{key}_spread"))


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
            cells += [row.get("label") or "-", *(paired_text(row, key) for key in ("vs_best", "predicted_vs_measured"))]
        rows.append(cells + [paired_text(s, "fat_vs_best")])
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
    """The same timings judged against another profile's choices (timings owe nothing to a profile)."""
    profile = planned_for(load(profile_path), raw_share=1.0)  # the configurations answered raw tensors
    topology = local_topology(report["meta"]["threads"])
    entries = [{**entry, "planner": {kind: planner_choice(profile, kind, topology.num_cores, entry["batch"], topology)
                                     for kind in ("isolated", "loaded")}} for entry in report["batches"]]
    return build_report({**report["meta"], "profile": str(profile_path), "rescored": True}, entries)
