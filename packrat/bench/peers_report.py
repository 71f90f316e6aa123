"""packrat bench peers's report (peers.py measures), pure: per B each peer's median and paired ratio to
packrat, the best peer's verdict, the outputs' difference from eager's, the tables and the pools' paths."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from packrat.bench.peer_runners import PEERS
from packrat.bench.results import fmt_num, markdown_table, span, with_spread
from packrat.bench.rounds import median_spread, paired


def diff_stats(output, reference) -> dict:
    """The deviation of `output` from `reference`, and whether it passes packrat's TOLERANCE (or cannot be compared)."""
    from packrat.models.runtimes import TOLERANCE, deviation

    found = deviation(output, reference)
    return {**found, "differs": "why" in found or found["relative_diff"] > TOLERANCE}


def by_round(run: dict | None) -> dict[tuple[int, int], float]:
    """A peer's figure in each (group, round) it was timed in."""
    return {(r["group"], r["round"]): r["latency_ms"] for r in (run or {}).get("rounds", [])
            if r.get("latency_ms") is not None}


def summarise(runs: dict[str, dict[str, dict]], batches: list[int], skipped: dict[str, str] | None = None) -> dict:
    """Per B, per peer: median (min–max), setup, outputs' difference from eager's, note, and the paired ratio to
    packrat (min–max); a peer never timed gets its start's error. `skipped`: peers that never ran, with why."""
    summary: dict[int, dict[str, dict]] = {}
    for batch in batches:
        table, rows = runs.get(str(batch), {}), {}
        for peer, run in table.items():
            start, good = run.get("start", {}), [r for r in run.get("rounds", []) if r.get("latency_ms") is not None]
            if not good:
                failed = next((r["error"] for r in run.get("rounds", []) if "error" in r), None)
                rows[peer] = {"error": start.get("skipped") or start.get("error") or failed or "not run",
                              **({"skipped": True} if "skipped" in start else {})}
                continue
            figures = median_spread([r["latency_ms"] for r in good])
            row = {"latency_ms": figures["median"], "spread_ms": figures["spread"], "rounds": len(good),
                   "failed_rounds": len(run["rounds"]) - len(good), "setup_s": start.get("setup_s"),
                   "max_abs_diff": start.get("max_abs_diff"), "relative_diff": start.get("relative_diff"),
                   "differs": bool(start.get("differs")), "diff_why": start.get("why"),
                   "note": "; ".join(filter(None, (start.get("note"), start.get("restarted"))))}
            staged = [r["stage_ms"] for r in good if r.get("stage_ms")]
            if staged:  # each stage's median over the rounds of its per-round medians
                row["stage_ms"] = {stage: statistics.median(s[stage] for s in staged) for stage in staged[0]}
            mine, packrat = by_round(run), by_round(table.get("packrat"))
            ratios = paired(mine, packrat)
            if ratios:
                behind = [packrat[key] - ms for key, ms in mine.items() if key in packrat]
                row.update(vs_packrat=statistics.median(ratios), vs_packrat_spread=[min(ratios), max(ratios)],
                           paired_rounds=len(ratios), packrat_behind_ms=statistics.median(behind))
            rows[peer] = row
        for peer, why in (skipped or {}).items():
            rows[peer] = {"error": why, "skipped": True}
        summary[batch] = {peer: rows[peer] for peer in sorted(rows, key=lambda p: (PEERS.index(p) if p in PEERS
                                                                                    else len(PEERS), p))}
    return summary


PEER_TARGET = 0.98  # best peer / packrat at every B, for every peer that runs here
AHEAD_TARGET = 1.10  # ... and this much where the oracle beats the best peer by as much
OWN = ("packrat", "packrat-later", "fat")  # packrat's own pools: not peers


def best_peer(rows: dict[str, dict]) -> tuple[str | None, dict, list[str]]:
    """(the peer closest to packrat: lowest paired ratio, else fastest; its row; the unmeasured) of one B's rows."""
    others = {p: r for p, r in rows.items() if p not in OWN}
    timed = {p: r for p, r in others.items() if r.get("latency_ms") is not None}
    best = min(timed, default=None, key=lambda p: (timed[p].get("vs_packrat") is None, timed[p].get("vs_packrat", 0.0),
                                                   timed[p]["latency_ms"]))
    return best, timed.get(best, {}), sorted(p for p in others if p not in timed)


def peer_verdict(ratio: float | None, unmeasured: Sequence[str], ahead: float | None = None,
                 oracle_needed: bool = True) -> tuple[bool, list[str]]:
    """(met, what was missing): best peer / packrat ≥ AHEAD_TARGET where the oracle beats the best peer by that
    much (`ahead`), else ≥ PEER_TARGET; unknown, so missed, where a peer (or a needed oracle) was unmeasured."""
    missing = ([f"not measured: {', '.join(unmeasured)}"] if unmeasured else []) + \
        (["no oracle"] if oracle_needed and ahead is None else [])
    target = AHEAD_TARGET if ahead is not None and ahead >= AHEAD_TARGET else PEER_TARGET
    return ratio is not None and not missing and ratio >= target, missing


def verdict_lines(summary: dict[int, dict[str, dict]]) -> list[str]:
    """Per B: the best peer against packrat paired per round, PASS or FAIL on PEER_TARGET by the median."""
    lines = []
    for batch, rows in summary.items():
        peer, row, unmeasured = best_peer(rows)
        value = row.get("vs_packrat")
        met, missing = peer_verdict(value, unmeasured, oracle_needed=False)
        shown = (f"{peer} / packrat {value:.3f}, median of {row['paired_rounds']} paired round(s), "
                 f"{span(row['vs_packrat_spread'], 3)}; packrat − {peer} {row['packrat_behind_ms']:+.3f} ms a batch"
                 if value is not None else "packrat or every peer not measured")
        lines.append(f"B={batch}: best peer / packrat ≥ {PEER_TARGET}: {'PASS' if met else 'FAIL'} ({shown}"
                     + (f"; {'; '.join(missing)}" if missing else "") + ")")
    return lines


def ms_digits(ms: float) -> int:
    """Decimals to show a batch's ms with: a model of next to no cost gets three (0.00 says nothing)."""
    return 2 if ms >= 1 else 3


def _diff_text(row: dict) -> str:
    if row.get("max_abs_diff") is None:
        return "DIFFERS (" + row["diff_why"] + ")" if row.get("diff_why") else "-"
    return f"{row['max_abs_diff']:.1e}" + (" DIFFERS" if row.get("differs") else "")


def markdown(summary: dict, header: str = "", plans: dict | None = None, predicted: dict | None = None) -> str:
    """One table per B, then a line per pool peer on its path. `plans`: B -> a line about packrat's plan,
    `predicted`: B -> its predicted ms."""
    lines = [header, ""] if header else []
    for batch, rows in summary.items():
        lines += [f"### B = {batch}", ""]
        if plans and plans.get(batch):
            lines += [plans[batch], ""]
        cells = []
        for peer, row in rows.items():
            if "latency_ms" not in row:
                cells.append([peer, "-", "-", "-", "-", row["error"]])
                continue
            failed = [f"{row['failed_rounds']} round(s) failed"] if row.get("failed_rounds") else []
            vs = with_spread(row.get("vs_packrat"), row.get("vs_packrat_spread"))
            cells.append([peer, with_spread(row["latency_ms"], row["spread_ms"], ms_digits(row["latency_ms"])), vs,
                          _diff_text(row),
                          fmt_num(row.get("setup_s")), "; ".join([row["note"]] * bool(row.get("note")) + failed)])
        lines += [markdown_table(["peer", "median ms (rounds' min–max)", "vs packrat, paired (min–max)",
                                  "max abs Δ vs eager", "setup s", "notes"], cells), ""]
        lines += [path_line(peer, row, (predicted or {}).get(batch) if peer == "packrat" else None)
                  for peer, row in rows.items() if row.get("stage_ms")]
        lines += [""] if any(row.get("stage_ms") for row in rows.values()) else []
    return "\n".join(lines).rstrip() + "\n"


HAND_OFF = ("queue", "send", "wake")  # a sub-batch's way to its instance, the batch's copy apart


def path_line(peer: str, row: dict, predicted_ms: float | None) -> str:
    """A pool peer's path at one B: hand-off, copy, codec and model stage per sub-batch; predicted against served."""
    stages = row["stage_ms"]
    hand_off = sum(stages.get(stage, 0.0) for stage in HAND_OFF)
    text = (f"- {peer} per sub-batch (medians): hand-off {hand_off:.3f} ms (queue {stages['queue']:.3f}, send "
            f"{stages['send']:.3f}, wake {stages['wake']:.3f}), copy {stages['copy']:.3f}, decode "
            f"{stages['decode']:.3f}, model {stages['model']:.2f}, encode {stages['encode']:.3f}, reply "
            f"{stages['reply']:.3f}, hand-out {stages['hand_out']:.3f}")
    if predicted_ms:
        text += f"; predicted {predicted_ms:.2f} ms / served {row['latency_ms']:.2f} = {predicted_ms / row['latency_ms']:.3f}"
    return text


def round_line(batch: int, group: int, r: int, table: dict) -> str:
    """One round's figures, each peer's over packrat's in the same round beside it."""
    done = {peer: e for peer, run in table.items() for e in run["rounds"] if (e["group"], e["round"]) == (group, r)}
    packrat = done.get("packrat", {}).get("latency_ms")
    parts = [f"{peer} " + (f"{fmt_num(e['latency_ms'], ms_digits(e['latency_ms']))} ms"
                           + (f" ({e['latency_ms'] / packrat:.2f})" if packrat else "")
                           if e.get("latency_ms") is not None else e.get("error", "?")) for peer, e in done.items()]
    return f"B={batch} round {r}" + (f" (group {group + 1})" if group else "") + ": " + ", ".join(parts)


def add_diffs(runs: dict[str, dict[str, dict]]) -> None:
    """Each start's output difference from eager's (or the untimed "_reference" start's), outputs dropped."""
    for table in runs.values():
        reference = next((t["start"].get("output") for p in ("eager", "_reference") if (t := table.get(p))), None)
        for run in table.values():
            output = run["start"].pop("output", None)
            if output is not None and reference is not None:
                run["start"].update(diff_stats(output, reference))
