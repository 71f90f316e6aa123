"""`ios-schedule`: search an IOS schedule for a zoo model and compare it with the alternatives."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# torch is imported in main(), after the restart with the OpenMP settings: loaded once, not twice.


def build_parser() -> argparse.ArgumentParser:
    from packrat.ios_scheduler.api import DEFAULT_MAX_PART_SIZE

    parser = argparse.ArgumentParser(
        prog="ios-schedule",
        description="Inter-operator scheduling for CPU: group the model's independent operators into stages whose "
                    "groups run concurrently on disjoint cores, choosing groups and core shares by measuring each "
                    "candidate stage on this CPU (dynamic program over the operators not yet scheduled).",
        epilog="example: ios-schedule --model inception_v3 --batch 1 --threads 2 --out sched.json --compare")
    parser.add_argument("--model", default="inception_v3", help="zoo model (default: inception_v3)")
    parser.add_argument("--batch", type=int, default=1, help="batch size the schedule is for (default: 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads (default: the cores this process may use); the command runs on the first "
                             "THREADS of those cores")
    parser.add_argument("--out", type=Path, default=None, help="write the schedule as JSON here")
    parser.add_argument("--compare", action="store_true",
                        help="measure plain PyTorch (sequential), greedy (every ready op at once) and IOS side by side")
    parser.add_argument("--max-group-size", type=int, default=3, help="operators per group (default: 3)")
    parser.add_argument("--max-num-groups", type=int, default=8, help="groups per stage (default: 8)")
    parser.add_argument("--max-part-size", type=int, default=None,
                        help=f"operators per search part, cut at bottlenecks where possible "
                             f"(default: {DEFAULT_MAX_PART_SIZE})")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per stage candidate (default: 5)")
    parser.add_argument("--costs", type=Path, default=None, metavar="FILE",
                        help="write the stage costs this search measured here (JSON), to bound a later search of "
                             "the same model and threads at another batch size")
    parser.add_argument("--bounds", type=Path, default=None, metavar="FILE",
                        help="stage costs written by --costs at another batch size: candidates that cannot win "
                             "even at their bound are not measured")
    parser.add_argument("--budget", type=float, default=None, metavar="S",
                        help="search for about S seconds: the parts of the graph where running operators side by "
                             "side could save most are searched first, those left after S s run one operator after "
                             "another (the report counts them); the end-to-end check comes on top "
                             "(default: search every part)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    from packrat.ios_scheduler.openmp import OPENMP_ENV, openmp_env

    if argv is None and any(os.environ.get(key) != value for key, value in OPENMP_ENV.items()):
        # libgomp reads its settings once, when torch loads: restart this command with them
        os.execve(sys.executable, [sys.executable, "-m", "packrat.cli.ios_schedule", *sys.argv[1:]], openmp_env())
    args = build_parser().parse_args(argv)
    available = sorted(os.sched_getaffinity(0))
    if argv is None and args.threads and args.threads < len(available):
        # a command of its own: it, and the OpenMP team torch starts, stay on the cores the schedule's
        # workers take (the first THREADS), the cores a runtime timed beside it gets too
        os.sched_setaffinity(0, available[:args.threads])
    import torch

    from packrat.ios_scheduler import api
    from packrat.ios_scheduler.timing import CostTable
    from packrat.models.zoo import resolve

    try:
        spec = resolve(args.model)
    except ValueError as exc:
        print(f"ios-schedule: error: {exc}", file=sys.stderr)
        return 2
    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    module, examples = spec.build(), spec.example_inputs(args.batch)
    kwargs = {"max_part_size": args.max_part_size} if args.max_part_size else {}
    try:
        bounds = CostTable.load(args.bounds) if args.bounds else None
        schedule = api.optimize(module, examples, threads, args.max_group_size, args.max_num_groups,
                                repeats=args.repeats, progress=not (args.quiet or args.json), name=args.model,
                                bounds=bounds, budget_s=args.budget, **kwargs)
    except (OSError, ValueError) as exc:
        print(f"ios-schedule: error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(schedule.to_json())
    if args.costs:
        args.costs.write_text(schedule.costs.to_json())
    report = {"model": args.model, "batch": args.batch, "threads": threads, "cores": sorted(os.sched_getaffinity(0)),
              "openmp_env": {key: os.environ.get(key) for key in OPENMP_ENV}, **schedule.search,
              "stages": len(schedule.stages),
              "parallel_stages": sum(1 for s in schedule.stages if len(s.groups) > 1 or s.kind == "merge")}
    if args.compare:
        graph = api.capture(module, examples)
        gm = graph.module  # the model as IOS runs it (api.trace), which every schedule here names
        greedy = api.greedy_schedule(graph, threads, args.batch, args.model)
        sequential = api.sequential_schedule(graph, threads, args.batch, args.model)
        seq_ms, greedy_ms, ios_ms = api.compare(gm, [sequential, greedy, schedule], examples)
        report.update(compare_sequential_ms=seq_ms, compare_greedy_ms=greedy_ms, compare_ios_ms=ios_ms)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.model}, batch {args.batch}, {threads} threads: {report['operators']} operators in "
          f"{report['parts']} parts; {report['states']} states, {report['measurements']} stage measurements "
          f"({report['stopped_early']} stopped after their first runs, {report['skipped']} candidates skipped "
          f"by their bounds), search {report['seconds']:.1f} s"
          + (f" ({report['unsearched_parts']} parts left sequential at the --budget)" if report["unsearched_parts"] else "")
          + f"; {report['stages']} stages, {report['parallel_stages']} run several groups")
    if report["kept"] == "sequential":
        kept = "slower than sequential end to end, so sequential is kept"
    else:
        kept = "kept" if report["parallel_stages"] else "no concurrent stage, so it runs as plain PyTorch"
    print(f"  searched schedule: {report['predicted_ios_ms']:.2f} ms by its stage costs "
          f"(sequential {report['predicted_sequential_ms']:.2f}), {report['ios_ms']:.2f} ms end to end "
          f"(sequential {report['sequential_ms']:.2f}): {kept}")
    if args.compare:
        print(f"  sequential {seq_ms:8.2f} ms   1.00×")
        print(f"  greedy     {greedy_ms:8.2f} ms   {seq_ms / greedy_ms:.2f}×")
        print(f"  IOS        {ios_ms:8.2f} ms   {seq_ms / ios_ms:.2f}×")
    if args.out:
        print(f"schedule written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
