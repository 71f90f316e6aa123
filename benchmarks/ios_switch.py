"""What switching between full-width operators and a concurrent stage costs on this CPU.

    GOMP_SPINCOUNT=10000 .venv/bin/python benchmarks/ios_switch.py [--models randwire,inception_v3] [--rounds 61]

Two measurements, in interleaved shuffled rounds, medians (2 threads):
1. the executor's hand-off: nothing run through `WorkerSet.run` on the calling thread (one group
   on every core), on one 1-thread worker, and as two 1-thread groups: both on workers (before
   issue 49), or one on the calling thread and one on a worker (the executor's way now);
2. per network (batch 1): S, a full-width stretch of 30 operators as one generated function, and
   P, a stage of two 1-thread groups of one operator each, each timed after itself and after the
   other. "S after P" - "S alone" is the switch back to the full-width team, "P after S" - "P alone"
   the switch into the stage; their sum is what `StageTimer.switch_cost` adds to every candidate.
   Both ways of running P, side by side in the same rounds.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from packrat.ios_scheduler.candidates import StageCandidates, example_values
from packrat.ios_scheduler.graph import capture
from packrat.ios_scheduler.runtime import WorkerSet
from packrat.models.zoo import resolve

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import doc_parser, first_cores, markdown_head, markdown_row
from packrat.cli.types import name_list
from packrat.bench.rounds import elapsed_ms, interleaved, medians

THREADS = 2


def timed(fn, before=None) -> float:
    (before or fn)()  # what runs just before the timed call: the call itself, or the other step
    return elapsed_ms(fn)


WAYS = {"one group on the caller": True, "both groups on workers": False}  # WorkerSet's caller_runs_one


def handoff(sets: dict[str, WorkerSet], rounds: int) -> dict:
    nothing = lambda: None  # noqa: E731
    workers = sets["one group on the caller"]
    cases = {"calling thread": lambda: timed(lambda: workers.run([nothing], (THREADS,))),
             "one 1-thread worker": lambda: timed(lambda: workers.run([nothing], (1,)))}
    for way, ws in sets.items():
        cases[f"two 1-thread groups, {way}"] = lambda ws=ws: timed(lambda: ws.run([nothing, nothing], (1, 1)))
    return medians(interleaved(cases, rounds, random))


def switch(model: str, sets: dict[str, WorkerSet], rounds: int) -> dict[str, dict]:
    """Per way of running P: its four figures, both ways measured in the same rounds."""
    spec = resolve(model)
    x = spec.example_input(1)
    graph = capture(spec.build().eval(), (x,))
    values = example_values(graph, (x,))
    middle = len(graph.ops) // 2
    cases = {}
    for way, workers in sets.items():
        candidates = StageCandidates(graph, values, workers, THREADS)
        full = candidates.group(range(middle - 30, middle))
        stage = candidates.on_workers([candidates.group([middle]), candidates.group([middle + 1])], (1, 1))
        cases.update({(way, "S alone"): lambda f=full: timed(f), (way, "S after P"): lambda f=full, p=stage: timed(f, p),
                      (way, "P alone"): lambda p=stage: timed(p), (way, "P after S"): lambda f=full, p=stage: timed(p, f)})
    found = medians(interleaved(cases, rounds, random))
    return {way: {name: ms for (w, name), ms in found.items() if w == way} for way in sets}


def main() -> None:
    parser = doc_parser(__doc__)
    parser.add_argument("--models", type=name_list(), default=["randwire", "inception_v3"],
                        help="zoo models (default randwire,inception_v3)")
    parser.add_argument("--rounds", type=int, default=61, help="interleaved rounds (default 61)")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    random.seed(0)
    sets = {way: WorkerSet(first_cores(THREADS), caller_runs_one=here) for way, here in WAYS.items()}
    with torch.inference_mode():
        print(markdown_head(["hand-off of nothing", "round trip"]))
        for name, ms in handoff(sets, args.rounds * 10).items():
            print(markdown_row([name, f"{ms * 1e3:.1f} µs"]))
        print("\n" + markdown_head(["model", "P's groups", "S alone", "S after P", "P alone", "P after S",
                                    "switch back", "switch in", "both"]))
        for model in args.models:
            for way, r in switch(model, sets, args.rounds).items():
                back, into = r["S after P"] - r["S alone"], r["P after S"] - r["P alone"]
                print(markdown_row([model, way, *(f"{r[k]:.3f} ms" for k in ("S alone", "S after P", "P alone",
                                                                             "P after S")),
                                    *(f"{ms * 1e3:.0f} µs" for ms in (back, into, back + into))]), flush=True)
    for workers in sets.values():
        workers.close()


if __name__ == "__main__":
    main()
