"""IOS on the four networks of the published evaluation: search cost, whether the stage costs
add up, and sequential vs greedy vs IOS latency, each case measured side by side by
`ios-schedule --compare`; beside them, the runtimes' own inter-operator parallelism on the same
cores and batch, so a user sees which to choose.

    .venv/bin/python benchmarks/ios_networks.py [--models inception_v3,squeezenet,randwire,nasnet]
                                                [--batches 1,8] [--threads 2] [--out out/ios-networks]
                                                [--peers onnxruntime,onnxruntime-parallel,openvino|none]
                                                [--budget S]

One `ios-schedule` at a time, each case's files kept in --out (a finished case is not run again).
The peers (ONNX Runtime sequential and parallel, OpenVINO latency hint, on packrat's artefacts) run
in one fresh process pinned to the case's cores, in 21 interleaved shuffled rounds, their median
beside IOS's as "IOS r×" (r = peer / IOS kept); "—" with a footnote when a peer cannot run."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from packrat.bench.harness import child_json, doc_parser, error_text, first_cores
from packrat.bench.results import markdown_head
from packrat.bench.rounds import elapsed_ms, interleaved, medians
from packrat.cli.types import int_list, name_list

MODELS = "inception_v3,squeezenet,randwire,nasnet"
PEERS = ("onnxruntime", "onnxruntime-parallel", "openvino")
ARTEFACT = {"onnxruntime": "onnxruntime", "onnxruntime-parallel": "onnxruntime", "openvino": "openvino"}  # its runtime
WARMUP, ROUNDS = 3, 21  # ios_scheduler.api.compare's: the peers are timed as the IOS column is
PEER_RESULT = "IOS-PEERS "  # marks the worker's result line: the runtimes print on stdout too


def run_case(model: str, batch: int, threads: int, out: Path, bounds: Path | None, budget: float | None = None) -> dict:
    stem = out / f"{model}-b{batch}-t{threads}{'-bounded' if bounds else ''}"
    report = stem.with_suffix(".json")
    if report.exists():  # resumable: a finished case is kept
        return json.loads(report.read_text())
    cmd = [sys.executable, "-m", "packrat.cli.ios_schedule", "--model", model, "--batch", str(batch), "--threads",
           str(threads), "--out", f"{stem}.schedule.json", "--costs", f"{stem}.costs.json", "--compare", "--json"]
    if bounds:
        cmd += ["--bounds", str(bounds)]
    if budget is not None:
        cmd += ["--budget", f"{budget:g}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{model} batch {batch} failed:\n{done.stderr[-2000:]}")
    report.write_text(done.stdout)
    return json.loads(done.stdout)


# ---- the peers: timed in a fresh process on the IOS case's cores --------------------------------

def peer_call(peer: str, spec, batch: int, threads: int) -> Callable[[], object]:
    """One run of `peer` on the example batch, built as packrat builds it (RuntimeRefused where it cannot run)."""
    from packrat.models.runtimes import OpenVinoRunner, ensure_artefact

    path = ensure_artefact(spec, ARTEFACT[peer])
    if peer == "openvino":
        runner, examples = OpenVinoRunner(path, spec, batch, threads), spec.example_inputs(batch)
        return lambda: runner(*examples)
    from packrat.bench.peer_runners import OrtRunner, ort_session

    # THREADS inter-op threads of one intra-op thread each: THREADS threads on THREADS cores (THREADS
    # of each measured slower: docs/benchmarks/ios.md); the peers take turns, so no spinning after a run.
    parallel = (threads, 1) if peer == "onnxruntime-parallel" else None
    session, _ = ort_session(str(path), threads, parallel, stop_spinning=True)
    return OrtRunner(session, spec, batch, "").run


def prepared(peer: str, spec, batch: int, threads: int) -> Callable[[], object]:
    """peer_call's run after WARMUP untimed runs (the first ones pay for allocations and caches)."""
    call = peer_call(peer, spec, batch, threads)
    for _ in range(WARMUP):
        call()
    return call


def refusal_text(exc: Exception) -> str:
    from packrat.models.runtimes import RuntimeRefused

    return str(exc) if isinstance(exc, RuntimeRefused) else error_text(exc)


def peer_worker(model: str, batch: int, threads: int, peers: list[str]) -> dict:
    """In the fresh process: pinned to the IOS workers' first `threads` cores, every peer prepared, then timed
    in ROUNDS shuffled interleaved rounds; per peer {"median_ms"} or {"error": why}."""
    cores = first_cores(threads)
    os.sched_setaffinity(0, cores)  # the runtimes' threads inherit it
    import torch

    torch.set_num_threads(1)  # torch only makes the inputs, as in packrat's instances of these runtimes
    from packrat.models.zoo import resolve

    spec = resolve(model)
    calls, results = {}, {}
    for peer in peers:
        try:
            calls[peer] = prepared(peer, spec, batch, threads)
        except Exception as exc:  # a runtime refusing or failing the model: reported, the others still run
            results[peer] = {"error": refusal_text(exc)}
    samples = interleaved({peer: lambda call=call: elapsed_ms(call) for peer, call in calls.items()}, ROUNDS,
                          random.Random(0))
    results.update({peer: {"median_ms": ms, "runs": ROUNDS} for peer, ms in medians(samples).items()})
    return {"model": model, "batch": batch, "threads": threads, "cores": cores,
            "peers": {peer: results[peer] for peer in peers}}


def not_installed(peer: str) -> str | None:
    from packrat.models.runtimes import INSTALL_HINT, installed

    runtime = ARTEFACT[peer]
    return None if installed(runtime) else f"{runtime} is not installed ({INSTALL_HINT})"


def run_peers(model: str, batch: int, threads: int, peers: list[str], out: Path) -> dict[str, dict]:
    """Each peer's result for the case, timed together in one fresh worker and kept in --out (not run again)."""
    path = out / f"{model}-b{batch}-t{threads}.peers.json"
    # a runtime not installed is not kept: it may be installed later
    results = {peer: {"error": why} for peer in peers if (why := not_installed(peer))}
    wanted = [peer for peer in peers if peer not in results]
    kept = json.loads(path.read_text())["peers"] if path.exists() else {}
    if any(peer not in kept for peer in wanted):
        found = child_json([sys.executable, __file__, "--peer-worker", "--models", model, "--batches", str(batch),
                            "--threads", str(threads), "--peers", ",".join(wanted)], marker=PEER_RESULT)
        if "error" in found:  # the worker itself failed: nothing kept, tried again next time
            kept = {peer: found for peer in wanted}
        else:
            path.write_text(json.dumps(found, indent=2))
            kept = found["peers"]
    results.update({peer: kept[peer] for peer in wanted})
    return {peer: results[peer] for peer in peers}


# ---- the table ----------------------------------------------------------------------------------

class Footnotes:
    """Why a peer has no figure, each reason numbered once, listed under the table."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}

    def mark(self, why: str) -> str:
        return f"[^{self.numbers.setdefault(why, len(self.numbers) + 1)}]"

    def lines(self) -> list[str]:
        return [f"[^{number}]: {why}" for why, number in self.numbers.items()]


def peer_cells(ios_ms: float, results: dict[str, dict], notes: Footnotes) -> list[str]:
    """A cell per peer: its median and peer / IOS (kept) (above 1: IOS is faster), or "—" and a footnote."""
    return [f"{r['median_ms']:.1f} ms (IOS {r['median_ms'] / ios_ms:.2f}×)" if "median_ms" in r
            else f"— {notes.mark(r['error'])}" for r in results.values()]


def row(r: dict, extra: Sequence[str] = ()) -> str:
    seq, greedy, ios = r["compare_sequential_ms"], r["compare_greedy_ms"], r["compare_ios_ms"]
    searched = r["kept"] == "searched"
    predicted = r["predicted_ios_ms"] if searched else r["predicted_sequential_ms"]
    retimed = r["retimed_ios_ms"] if searched else r["retimed_sequential_ms"]
    measured = r["ios_ms"] if searched else r["sequential_ms"]
    if not searched:
        kept = f"sequential (searched: {r['sequential_ms'] / r['ios_ms']:.2f}× end to end)"
    else:
        kept = f"searched, {r['parallel_stages']} concurrent stages" if r["parallel_stages"] else "searched, all sequential"
    return (f"| {r['model']} | {r['batch']} | {r['threads']} | {r['operators']} | {search_text(r)} | "
            f"{r['measurements']} ({r['stopped_early']} stopped, {r['skipped']} skipped) | {seq:.1f} ms | "
            f"{greedy:.1f} ms ({seq / greedy:.2f}×) | {ios:.1f} ms ({seq / ios:.2f}×) | "
            f"{r['predicted_sequential_ms'] / r['predicted_ios_ms']:.2f}× | {kept} | "
            f"{predicted:.1f} / {measured:.1f} ms ({predicted / measured:.2f}) | "
            f"{retimed:.1f} ms ({retimed / measured:.2f}) | {r['switch_ms'] or 0:.2f} ms |"
            + "".join(f" {cell} |" for cell in extra))


def search_text(r: dict) -> str:
    """The search's time, and the parts a --budget left sequential (the search's report counts them)."""
    left = r.get("unsearched_parts") or 0
    return f"{r['seconds']:.0f} s" + (f" ({left} of {r['parts']} parts left sequential)" if left else "")


def head(peers: list[str]) -> str:
    return markdown_head(["model", "batch", "threads", "operators", "search", "stage measurements", "sequential",
                          "greedy", "IOS (kept)", "searched vs sequential, by stage costs", "kept",
                          "kept: predicted / measured", "kept: stages timed again before the check (vs measured)",
                          "switch cost", *peers])


def peer_list(text: str) -> list[str]:
    """--peers: the peers named, in order; none for "none" or ""."""
    return [] if text.strip().lower() in ("", "none") else name_list(PEERS, "peer")(text)


def parser() -> argparse.ArgumentParser:
    parser = doc_parser(__doc__)
    parser.add_argument("--models", type=name_list(), default=MODELS.split(","), help=f"zoo models (default {MODELS})")
    parser.add_argument("--batches", type=int_list, default=[1, 8], help="batch sizes (default 1,8)")
    parser.add_argument("--threads", type=int_list, default=[2],
                        help="comma-separated thread counts (default 2; e.g. 8,16 on a larger machine)")
    parser.add_argument("--bounds-from", type=int, default=None, metavar="BATCH",
                        help="bound each search with the stage costs of this batch size's (earlier) search")
    parser.add_argument("--out", type=Path, default=Path("out/ios-networks"))
    parser.add_argument("--budget", type=float, default=None, metavar="S",
                        help="each search's --budget (ios-schedule): the parts with most room for concurrency first, "
                             "those left after S s sequential (default: every part searched)")
    parser.add_argument("--peers", type=peer_list, default=list(PEERS),
                        help=f"runtimes timed beside IOS (default {','.join(PEERS)}; none: no peers)")
    parser.add_argument("--peer-worker", action="store_true",
                        help=argparse.SUPPRESS)  # the fresh process timing one case's peers
    return parser


def main() -> None:
    args = parser().parse_args()
    if args.peer_worker:
        (model,), (batch,), (threads,) = args.models, args.batches, args.threads  # one case
        print(PEER_RESULT + json.dumps(peer_worker(model, batch, threads, args.peers)), flush=True)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    notes = Footnotes()
    print(head(args.peers))
    for threads in args.threads:
        for model in args.models:
            for batch in args.batches:
                bounds = None
                if args.bounds_from is not None and args.bounds_from != batch:
                    bounds = args.out / f"{model}-b{args.bounds_from}-t{threads}.costs.json"
                    run_case(model, args.bounds_from, threads, args.out, None, args.budget)
                report = run_case(model, batch, threads, args.out, bounds, args.budget)
                peers = run_peers(model, batch, threads, args.peers, args.out) if args.peers else {}
                print(row(report, peer_cells(report["compare_ios_ms"], peers, notes)), flush=True)
    if notes.numbers:
        print("\n" + "\n".join(notes.lines()))


if __name__ == "__main__":
    main()
