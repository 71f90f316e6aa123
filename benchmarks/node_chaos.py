"""The node under faults (issue 33): several packrat models in one TorchServe, each under
closed-loop locust load, while the faults of packrat/bench/node_chaos.py strike one at a time,
each in a window of --window-s of its own (the re-register and move faults act on --target).

    .venv/bin/python benchmarks/node_chaos.py                     # resnet50, squeezenet, bert_base
    .venv/bin/python benchmarks/node_chaos.py --faults owner-kill,owner-stop --window-s 40

Per fault: how long the node was not whole, a move under way, the lease's epochs, and per model
the requests sent, failed and their p99; --out holds node_chaos.md and node_chaos.json."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from packrat.bench.harness import doc_parser
from packrat.bench.results import fmt_num, markdown_table, write_json
from packrat.bench import node_chaos
from packrat.cli.types import name_list
from packrat.settings import NODE_DIR_ENV


def table(rows: list[dict], models: list[str]) -> str:
    return markdown_table(
        ["fault", "what", "not whole (s)", "whole again (s) from start / end", "moving (s)", "lease epochs"]
        + [f"{m}: sent, failed, p99 ms" for m in models],
        [[r["kind"], r["what"], fmt_num(r["not_whole_s"], 2),
          f"{fmt_num(r['whole_again_s'], 2)} / {fmt_num(r['whole_after_fault_ended_s'], 2)}",
          fmt_num(r["moving_s"], 2), ",".join(map(str, r["lease_epochs"]))]
         + [f"{r['models'][m]['sent']}, {r['models'][m]['failed']}, {fmt_num(r['models'][m]['p99_ms'], 0)}"
            for m in models] for r in rows])


def main() -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("--models", type=name_list(), default=["resnet50", "squeezenet", "bert_base"])
    parser.add_argument("--target", default="squeezenet", help="the model the re-register and move faults act on")
    parser.add_argument("--faults", type=name_list(node_chaos.FAULTS, "fault"), default=list(node_chaos.FAULTS))
    parser.add_argument("--users", type=int, default=2, help="closed-loop users per model (default: 2)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--window-s", type=float, default=45.0, help="each fault's window (default: 45)")
    parser.add_argument("--stop-s", type=float, default=30.0, help="how long a stopped process stays stopped")
    parser.add_argument("--slow-s", type=float, default=20.0,
                        help="how long the other models' moves wait while the target leaves and returns (default: 20)")
    parser.add_argument("--fail-s", type=float, default=10.0,
                        help="how long the other models' moves fail while the target leaves and returns (default: 10)")
    parser.add_argument("--out", type=Path, default=Path("out/node_chaos"))
    args = parser.parse_args()
    if args.target not in args.models:
        parser.error("--target must be one of --models")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ[NODE_DIR_ENV.name] = str(out / "node")  # a fresh node for this server
    from packrat.deploy import torchserve
    from packrat.serving.node import node_dir

    server, mars = node_chaos.start_server(args.models, out, args.batch_size)
    try:
        seconds = args.warmup_s + len(args.faults) * args.window_s + 5
        running = node_chaos.load(server, args.models, args.users, seconds, out)
        node = node_chaos.NodeDir(node_dir(sorted(os.sched_getaffinity(0))))
        chaos = node_chaos.Chaos(server, mars, node, stop_s=args.stop_s, slow_s=args.slow_s, fail_s=args.fail_s,
                                 window_s=args.window_s, log=lambda text: print(text, flush=True))
        time.sleep(args.warmup_s)
        print(f"-- warm: node whole {node.whole()}", flush=True)
        faults = [chaos.strike(kind, args.target) for kind in args.faults]
        for thread in running["threads"]:
            thread.join()
    finally:
        torchserve.stop(server)
    rows = node_chaos.summary(faults, running["records"])
    write_json(out / "node_chaos.json", {"models": args.models, "users": args.users, "faults": rows})
    text = table(rows, args.models)
    (out / "node_chaos.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
