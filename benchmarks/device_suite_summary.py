"""SUMMARY.md for benchmarks/device_suite.sh, from what its steps left in OUT_DIR.

    python benchmarks/device_suite_summary.py OUT_DIR

From machine.json, steps.tsv (the suite's log) and each step's files: the machine, each step's time
against its budget, its commands and tables, and the files a step left missing. The suite calls it
after every step, so an interrupted run still has a summary."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from packrat.profiling.plots import SHORT_RUNTIMES
from packrat.profiling.profiles import held
from packrat.serving.node.files import read_json  # None where missing or half-written (a step stopped)

from packrat.bench import oracle_configs, oracle_report, peers_report
from packrat.bench.harness import doc_parser
from packrat.bench.results import fmt_num, markdown_table, with_spread

STEPS = {"profile": "(a) Profile (the search)", "peers": "(b) packrat against its peers",
         "oracle": "(c) Planner vs the oracle", "bench": "(d) Pool-only bench: fat vs plan",
         "ios": "(e) IOS on many cores", "ios-plan": "(g) IOS instances in the plan"}
VERDICTS = "(f) Per B: against the best peer, predicted / served, against the oracle"
LETTER = {key: title.split()[0] for key, title in STEPS.items()}
FILES = {"profile": ["{MODEL}.csv", "{MODEL}-search.json", "{MODEL}-plans.json"], "peers": ["peers.json"],  # each
         "oracle": ["oracle.json"], "bench": ["pool-bench/pool-bench.json"], "ios": ["ios-networks.md"],  # step's
         "ios-plan": ["{IOS}-ios.csv", "ios-plan.json", "oracle-ios.json"]}  # files: those missing are named, and why


def _ratio(top, bottom) -> str:
    ok = all(v is not None and math.isfinite(v) for v in (top, bottom)) and bottom
    return f"{top / bottom:.2f}×" if ok else "-"


def read_log(out: Path) -> tuple[dict[str, list[str]], dict[str, dict]]:
    """(commands per step, finished steps {key: {title, seconds, budget, status}}, "budgets") from steps.tsv."""
    commands: dict[str, list[str]] = {}
    steps: dict[str, dict] = {}
    path = out / "steps.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, key, *rest = line.split("\t")
        if kind == "budgets":
            commands["budgets"] = [key]
        elif kind == "cmd":
            commands.setdefault(key, []).append(rest[0])
        elif kind == "step":
            title, seconds, budget, status = rest
            steps[key] = {"title": title, "seconds": int(seconds), "budget": int(budget), "status": status}
    return commands, steps


def header(machine: dict, steps: dict[str, dict], budgets: str = "not recorded") -> list[str]:
    lines = ["# Many-core suite (benchmarks/device_suite.sh)", "",
             f"Machine: {machine.get('cpu', '?')}, T = {machine.get('threads', '?')} core(s) "
             f"({machine.get('logical_cpus', '?')} logical CPUs), torch {machine.get('torch', '?')}, "
             f"Python {machine.get('python', '?')}, {machine.get('date', '?')}.",
             "Settings: " + (", ".join(f"{k}={v}" for k, v in machine.get("settings", {}).items()) or "the defaults")
             + ".", f"Budgets: {budgets}.", ""]
    rows = [[f"{LETTER[key]} {step['title']}", f"{step['seconds']} s", f"{step['budget']} s", step["status"]]
            for key in STEPS if (step := steps.get(key))]
    total = sum(s["seconds"] for s in steps.values())
    return lines + [markdown_table(["step", "took", "budget", "status"], rows + [["total", f"{total} s", "", ""]]), ""]


def profile_tables(out: Path, machine: dict) -> list[str]:
    model = machine.get("settings", {}).get("SUITE_MODEL", "resnet50")
    lines: list[str] = []
    search = read_json(out / f"{model}-search.json") or {}
    if search:  # what `packrat profile --json` printed: the search's account (keys it lacks show "-")
        lines += [markdown_table(["points measured", "grid", "fraction", "wall s", "budget s", "unaccounted s", "stopped"],
                                 [[search.get("points", "-"), search.get("grid", "-"), fmt_num(search.get("fraction"), 2),
                                   fmt_num(search.get("wall_s")), fmt_num(search.get("budget_s")),
                                   fmt_num(search.get("unaccounted_s")), search.get("stopped", "-")]]), ""]
        runtimes = search.get("runtimes") or {}
        lines += [markdown_table(["runtime", "build s", "load s", "measure s", "points"],
                                 [[name, *(fmt_num(r.get(k)) for k in ("build_s", "load_s", "measure_s")),
                                   r.get("points", "-")] for name, r in runtimes.items()]), ""] if runtimes else []
    profile = held(out / f"{model}.csv")
    if profile is None and (out / f"{model}.csv").exists():
        lines += [f"{model}.csv holds no points (a head without rows): the profile measured none.", ""]
    if profile is not None:
        batches, loaded = profile.batches, profile.loaded
        basis = ("served (decode, model and encode of the profile's payload)" if profile.basis == "served"
                 else "model-only")
        lines += [f"{'Loaded mean (isolated mean where measured)' if loaded else 'Isolated mean'} {basis} latency in "
                  "ms, and the point's runtime (OV OpenVINO, ORT ONNX Runtime, none: inductor); · = not measured "
                  "(the search found it could not change a plan, or its budget ended first).", ""]

        def cell(t: int, b: int) -> str:
            alone = profile.isolated.get((t, b)) if loaded else None  # measured alone as well (--isolated-too)
            figure = fmt_num(profile.latency[t, b]) + (f" ({fmt_num(alone)})" if alone is not None else "")
            return f"{figure} {SHORT_RUNTIMES.get(profile.runtimes.get((t, b)), '')}".rstrip()

        cells = [[t, *(cell(t, b) if (t, b) in profile.latency else "·" for b in batches)] for t in profile.threads]
        lines += [markdown_table(["t \\ b", *batches], cells), ""]
    rows = read_json(out / f"{model}-plans.json")
    if rows:
        rows = rows if isinstance(rows, list) else [rows]
        cells = [[p["batch"], oracle_configs.label(oracle_configs.canonical((i["threads"], i["batch"], i.get("runtime", "inductor"))
                                                            for i in p["instances"])),
                  fmt_num(p["expected_latency_ms"]), fmt_num(p.get("fat_latency_ms")),
                  _ratio(p.get("fat_latency_ms"), p["expected_latency_ms"])] for p in rows]
        lines += [markdown_table(["B", "plan ⟨threads, batch⟩", "expected ms", "fat ⟨T, B⟩ ms", "speedup (predicted)"],
                                 cells), ""]
    return lines


def bench_tables(out: Path) -> list[str]:
    results = read_json(out / "pool-bench" / "pool-bench.json")
    if results is None:
        return []
    lines = [f"Medians of {results[0]['rounds'] if results else '?'} interleaved rounds in ms (in-process model, "
             "fat pool, planned pool, each answering B raw-tensor requests); transport: the fat pool's wall time "
             "minus its instance's own model time.", ""]
    cells = [[r["batch"], *(fmt_num(m.get(case)) for case in ("in-process", "pool-fat", "pool-plan")),
              _ratio(m.get("pool-fat"), m.get("pool-plan")), _ratio(r.get("predicted_fat_ms"), r.get("predicted_plan_ms")),
              _ratio(r.get("predicted_plan_ms"), m.get("pool-plan")), fmt_num(r.get("transport_overhead_ms"), 2),
              r["plan"] + (f" ({r['fallback']})" if r.get("fallback") else "")]
             for r in results for m in [r["median_ms"]]]
    return lines + [markdown_table(["B", "in-process", "pool, fat ⟨T, B⟩", "pool, plan", "plan vs fat",
                                    "predicted plan vs fat", "plan: predicted / measured", "transport ms", "plan"],
                                   cells), ""]


def oracle_tables(out: Path, name: str = "oracle.json") -> list[str]:
    report = read_json(out / name)
    if not report:
        return []
    lines = [oracle_report.markdown(report), ""]
    lines += [f"- {line}" for line in report["verdicts"]["loaded"]]
    lines += [f"- (for comparison) {line}" for line in report["verdicts"]["isolated"]]
    cells = []
    for entry in report["batches"]:
        best = min((c["median_ms"] for c in entry["configs"] if c.get("median_ms") is not None), default=None)
        for c in entry["configs"]:
            chosen = [kind for kind in ("loaded", "isolated")
                      if (entry["planner"].get(kind) or {}).get("label") == c["label"]]
            fats = entry.get("fat") or []
            chosen += ["fat"] if c["label"] in ([fats] if isinstance(fats, str) else fats) else []
            cells.append([entry["batch"], c["label"], fmt_num(c.get("median_ms")), _ratio(c.get("median_ms"), best),
                          fmt_num(c.get("predicted_ms")), _ratio(c.get("predicted_ms"), c.get("median_ms")),
                          c.get("error") or ", ".join(chosen)])
    return lines + ["", "Every configuration timed (median ms over the rounds), and as the profile's planned figures "
                    "predict it (its slowest instance's point; - where a point was not measured):", "",
                    markdown_table(["B", "configuration", "median ms", "vs best", "predicted ms", "predicted / measured",
                                    "planner's choice"], cells), ""]


def ios_tables(out: Path) -> list[str]:
    path = out / "ios-networks.md"
    lines = path.read_text().splitlines() if path.exists() else []
    rows = [line for line in lines if line.startswith("|")]
    notes = [line for line in lines if line.startswith("[^")]  # why a peer's cell is "—"
    return rows + [""] + notes + [""] * bool(notes) if len(rows) > 2 else []


def ios_plan_tables(out: Path) -> list[str]:
    """The B = 1 plan's IOS instances and gain (ios-plan.json); per B of oracle-ios.json, served against the best without IOS."""
    from packrat.cli.output import gain_lines

    lines = []
    for path in sorted(out.glob("*-ios.csv")):  # the step's profile: where IOS was measured at all
        if (found := held(path)) is None:
            lines += [f"{path.name} holds no points.", ""]
            continue
        points = sorted(found.by_runtime.get("ios", {}))
        shown = ", ".join(f"⟨{t},{b}⟩" for t, b in points) or "none (the other runtimes used half the threads or more)"
        lines += [f"IOS points in {path.name}: {shown}.", ""]
    plan = read_json(out / "ios-plan.json")
    if plan:
        shapes = oracle_configs.canonical((i["threads"], i["batch"], i["runtime"]) for i in plan["instances"])
        gains = [f"- {line}" for line in gain_lines(plan.get("ios", []))]
        lines += [f"The plan at B = {plan['batch']}: {oracle_configs.label(shapes)}, expected {fmt_num(plan['expected_latency_ms'])} "
                  "ms.", ""] + (gains + [""] if gains else [])
    for entry in (read_json(out / "oracle-ios.json") or {}).get("batches", []):
        lines += [f"- B = {entry['batch']}: {ios_verdict(entry)}"]
    return lines + [""] + oracle_tables(out, "oracle-ios.json")


def ios_verdict(entry: dict) -> str:
    """The planner's (loaded) choice as served against the fastest configuration without IOS instances."""
    timed = {c["label"]: c for c in entry["configs"] if c.get("median_ms") is not None}
    chosen = timed.get((entry["planner"].get("loaded") or {}).get("label"))
    plain = [c for c in timed.values() if all(runtime != "ios" for *_, runtime in c["config"])]
    if chosen is None or not plain:
        return "the plan or every configuration without IOS was not timed"
    best = min(plain, key=lambda c: c["median_ms"])
    uses = "with IOS instances" if any(runtime == "ios" for *_, runtime in chosen["config"]) else "without IOS"
    return (f"the plan {chosen['label']} ({uses}) served {fmt_num(chosen['median_ms'])} ms; the fastest without IOS, "
            f"{best['label']}, {fmt_num(best['median_ms'])} ms ({_ratio(best['median_ms'], chosen['median_ms'])})")


def peers_tables(out: Path) -> list[str]:
    """packrat bench peers's tables, as it printed them (peers.json's markdown: a table per B, its plan and path)."""
    text = (read_json(out / "peers.json") or {}).get("markdown", "")
    return text.splitlines() + [""] if text else []


def verdict_rows(peers: dict | None, report: dict | None) -> list[dict]:
    """Per B from peers.json and oracle.json (either may be missing): packrat's served latency and prediction,
    the closest peer and its paired ratio, the oracle's summary of the loaded plan."""
    batches = sorted({int(b) for b in (peers or {}).get("summary", {})}
                     | {s["batch"] for s in (report or {}).get("summaries", [])})
    rows = []
    for batch in batches:
        row: dict = {"batch": batch}
        table = (peers or {}).get("summary", {}).get(str(batch), {})
        best, best_row, row["unmeasured_peers"] = peers_report.best_peer(table)  # unmeasured: failed, or not installed
        plan = (peers or {}).get("meta", {}).get("pools", {}).get("packrat", {}).get(str(batch), {})
        row.update(packrat_ms=table.get("packrat", {}).get("latency_ms"), predicted_ms=plan.get("predicted_ms"),
                   plan=plan.get("describe"), best_peer=best, best_peer_ms=best_row.get("latency_ms"),
                   vs_peer=best_row.get("vs_packrat"), vs_peer_spread=best_row.get("vs_packrat_spread"))
        found = next((s for s in (report or {}).get("summaries", []) if s["batch"] == batch), {})
        loaded = found.get("loaded") or {}
        row.update(oracle=found.get("best"), oracle_ms=found.get("best_ms"), vs_oracle=loaded.get("vs_best"),
                   vs_oracle_spread=loaded.get("vs_best_spread"), oracle_pred=loaded.get("predicted_vs_measured"))
        rows.append(row)
    return rows


def verdict_tables(out: Path) -> list[str]:
    rows = verdict_rows(read_json(out / "peers.json"), read_json(out / "oracle.json"))
    if not rows:
        return ["Neither the peers nor the oracle ran.", ""]
    cells = []
    for r in rows:
        served = r["predicted_ms"] / r["packrat_ms"] if r.get("predicted_ms") and r.get("packrat_ms") else None
        ahead = r["best_peer_ms"] / r["oracle_ms"] if r.get("best_peer_ms") and r.get("oracle_ms") else None
        peer_met, missing = peers_report.peer_verdict(r["vs_peer"], r["unmeasured_peers"], ahead)
        cells.append([r["batch"], r.get("plan") or "-", fmt_num(r.get("packrat_ms")),
                      f"{r['best_peer']} {fmt_num(r['best_peer_ms'])}" if r.get("best_peer") else "-",
                      _mark(r["vs_peer"], peer_met, r["vs_peer_spread"]) + (f" ({'; '.join(missing)})"
                                                                            if missing and r["vs_peer"] else ""),
                      _mark(served, oracle_report.met("predicted_vs_measured", served)), r.get("oracle") or "-",
                      _mark(r.get("vs_oracle"), oracle_report.met("vs_best", r.get("vs_oracle")), r.get("vs_oracle_spread")),
                      fmt_num(r.get("oracle_pred"), 2)])
    return [f"Targets: best peer / packrat ≥ {peers_report.PEER_TARGET} at every B, ≥ {peers_report.AHEAD_TARGET} where the oracle beats the "
            f"best peer by {peers_report.AHEAD_TARGET - 1:.0%}; predicted / served within {oracle_report.PREDICTION_TOLERANCE:.0%}; the "
            f"plan within {oracle_report.PLAN_TOLERANCE:.0%} of the oracle. packrat and the peers from (b), the oracle "
            "from (c); the ratios to packrat and to the oracle are paired per round: their median over the rounds, "
            "then the rounds' min–max; ✓ met, ✗ missed.", "",
            markdown_table(["B", "packrat's plan", "packrat ms", "best peer ms", "best peer / packrat",
                            "predicted / served", "oracle (best)", "plan / oracle", "oracle: pred / meas"], cells), ""]


def _mark(value: float | None, met: bool, spread: list[float] | None = None) -> str:
    return "-" if value is None else f"{with_spread(value, spread)} {'✓' if met else '✗'}"


def summary(out: Path) -> str:
    machine = read_json(out / "machine.json") or {}
    commands, steps = read_log(out)
    tables = {"profile": lambda: profile_tables(out, machine), "bench": lambda: bench_tables(out),
              "oracle": lambda: oracle_tables(out), "ios": lambda: ios_tables(out), "peers": lambda: peers_tables(out),
              "ios-plan": lambda: ios_plan_tables(out)}
    lines = header(machine, steps, commands.get("budgets", ["not recorded"])[0])
    for key, title in STEPS.items():
        if key == "ios-plan":  # the letters in order: the verdicts on (b) and (c) are (f)
            lines += [f"## {VERDICTS}", ""] + verdict_tables(out)
        lines += [f"## {title}", ""]
        step = steps.get(key)
        if step is None:
            lines += ["Not run." if key not in commands else "Running, or stopped before its end.", ""]
            continue
        lines += [f"Command: `{command}`" for command in commands.get(key, [])]
        lines += ["", f"Took {step['seconds']} s (budget {step['budget']} s): {step['status']}.", ""]
        lines += tables[key]()
        names = {"MODEL": machine.get("settings", {}).get("SUITE_MODEL", "resnet50"),
                 "IOS": machine.get("settings", {}).get("SUITE_IOS_PLAN_MODEL", "inception_v3")}
        missing = [name.format(**names) for name in FILES[key] if not (out / name.format(**names)).exists()]
        lines += [f"Missing: {', '.join(missing)} (the step: {step['status']}).", ""] if missing else []
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("out", type=Path, metavar="OUT_DIR", help="the suite's output folder")
    out = parser.parse_args(argv).out
    (out / "SUMMARY.md").write_text(summary(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
