"""What switching between full-width operators and a concurrent stage costs on this CPU.

    GOMP_SPINCOUNT=10000 .venv/bin/python benchmarks/ios_switch.py [--models randwire,inception_v3] [--rounds 61]

Two measurements, in interleaved shuffled rounds, medians (2 threads):
1. the executor's hand-off: nothing run through `WorkerSet.run` on the calling thread (one group
   on every core), on one 1-thread worker, and on two at once;
2. per network (batch 1): S, a full-width stretch of 30 operators as one generated function, and
   P, a stage of two 1-thread groups of one operator each, each timed after itself and after the
   other. "S after P" - "S alone" is the switch back to the full-width team, "P after S" - "P alone"
   the switch into the stage. Q is P's two operators one after another on every thread, timed
   alone and after S too: "Q after S" - "Q alone" is what S leaves cold in the caches for anything
   after it, so the switch a concurrent stage adds beyond running its operators in order is
   "switch back" + ("P after S" - "P alone") - ("Q after S" - "Q alone"), what
   `StageTimer.switch_cost` adds to every concurrent candidate (issue 49; before, it added the
   first sum, cold caches included).
"""

from __future__ import annotations

import random

import torch

from packrat.ios_scheduler.candidates import StageCandidates, example_values
from packrat.ios_scheduler.graph import capture
from packrat.ios_scheduler.runtime import WorkerSet
from packrat.models.zoo import resolve

from packrat.bench.harness import doc_parser, first_cores
from packrat.bench.results import markdown_head, markdown_row
from packrat.cli.types import name_list
from packrat.bench.rounds import elapsed_ms, interleaved, medians

THREADS = 2


def timed(fn, before=None) -> float:
    (before or fn)()  # what runs just before the timed call: the call itself, or the other step
    return elapsed_ms(fn)


def handoff(workers: WorkerSet, rounds: int) -> dict:
    nothing = lambda: None  # noqa: E731
    return medians(interleaved({
        "calling thread": lambda: timed(lambda: workers.run([nothing], (THREADS,))),
        "one 1-thread worker": lambda: timed(lambda: workers.run([nothing], (1,))),
        "two 1-thread workers": lambda: timed(lambda: workers.run([nothing, nothing], (1, 1)))}, rounds, random))


def switch(model: str, workers: WorkerSet, rounds: int) -> dict:
    spec = resolve(model)
    x = spec.example_input(1)
    graph = capture(spec.build().eval(), (x,))
    candidates = StageCandidates(graph, example_values(graph, (x,)), workers, THREADS)
    middle = len(graph.ops) // 2
    full = candidates.group(range(middle - 30, middle))
    stage = candidates.on_workers([candidates.group([middle]), candidates.group([middle + 1])], (1, 1))
    in_order = candidates.group([middle, middle + 1])
    return medians(interleaved({"S alone": lambda: timed(full), "S after P": lambda: timed(full, stage),
                                "P alone": lambda: timed(stage), "P after S": lambda: timed(stage, full),
                                "Q alone": lambda: timed(in_order), "Q after S": lambda: timed(in_order, full)},
                               rounds, random))


def main() -> None:
    parser = doc_parser(__doc__)
    parser.add_argument("--models", type=name_list(), default=["randwire", "inception_v3"],
                        help="zoo models (default randwire,inception_v3)")
    parser.add_argument("--rounds", type=int, default=61, help="interleaved rounds (default 61)")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    random.seed(0)
    workers = WorkerSet(first_cores(THREADS))
    with torch.inference_mode():
        print(markdown_head(["hand-off of nothing", "round trip"]))
        for name, ms in handoff(workers, args.rounds * 10).items():
            print(markdown_row([name, f"{ms * 1e3:.1f} µs"]))
        print("\n" + markdown_head(["model", "S alone", "S after P", "P alone", "P after S", "Q alone", "Q after S",
                                    "switch back", "switch in", "cold caches (Q)", "switch beyond Q"]))
        for model in args.models:
            r = switch(model, workers, args.rounds)
            back, into = r["S after P"] - r["S alone"], r["P after S"] - r["P alone"]
            cold = r["Q after S"] - r["Q alone"]
            print(markdown_row([model, *(f"{r[k]:.3f} ms" for k in ("S alone", "S after P", "P alone", "P after S",
                                                                     "Q alone", "Q after S")),
                                *(f"{ms * 1e3:.0f} µs" for ms in (back, into, cold, back + into - cold))]), flush=True)
    workers.close()


if __name__ == "__main__":
    main()
