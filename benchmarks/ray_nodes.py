"""One Ray node against two on the same cores: packrat's Ray Serve front end under locust.

Layouts on cores 0 and 1 (packrat/deploy/ray_local.py pins each node): one node on both, its
replica planning batch B or 2B (every user) for 2 cores; two nodes, one a core, a replica on each
planning batch B for 1 core. 2B closed-loop locust users load /predictions/MODEL for --duration s;
each round runs every layout (a fresh cluster each), in a rotated order; the summary gives medians.

    python benchmarks/ray_nodes.py --model resnet50 --profile out/bench17/resnet50-compile.csv \
        --batch 4 --duration 60 --rounds 2 --out out/ray_nodes

--kill instead runs the two nodes under the same load, kills node [1]'s raylet (kill -9) a third
of the way in and starts the node again at two thirds: failures, and throughput per phase.

    python benchmarks/ray_nodes.py --kill --model resnet50 --profile out/bench17/resnet50-compile.csv \
        --batch 4 --duration 90 --out out/ray_kill
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

from packrat.bench.harness import doc_parser
from packrat.bench.results import markdown_table, write_json
from packrat.bench.rounds import in_rounds

# layout → (nodes' cores, each replica's batch as a multiple of B)
LAYOUTS = {"one node (cores 0-1), batch B": ([[0, 1]], 1),
           "one node (cores 0-1), batch 2B": ([[0, 1]], 2),
           "two nodes (core 0, core 1), batch B each": ([[0], [1]], 1)}
WARMUP_S = 10


@contextmanager
def deployed(nodes: list[list[int]], batch: int, args: argparse.Namespace):
    """A local cluster of `nodes`, packrat's Ray Serve app on it with replicas of batch `batch`:
    (the cluster, a run_locust of 2B users against it with the model's payload)."""
    from packrat.codec.payloads import build_payload
    from packrat.deploy.ray_local import LocalCluster
    from packrat.deploy.torchserve import free_port
    from packrat.frontends import ray_serve
    from packrat.loadtest.runner import run_locust

    with LocalCluster(nodes, port=free_port()).start() as cluster, \
            ray_serve.deployed({"model": args.model, "profiles": [str(args.profile.resolve())], "max_batch": batch},
                               address=cluster.address, port=free_port()) as (url, model):
        def load(seconds: float, where: Path, **kw):
            return run_locust(url, model, 2 * args.batch, seconds, where, payload=build_payload(model), **kw)

        yield cluster, load


def run_layout(name: str, nodes: list[list[int]], batch: int, args: argparse.Namespace, out: Path) -> dict:
    started = time.monotonic()
    with deployed(nodes, batch, args) as (_, load):
        deploy_s, users = time.monotonic() - started, 2 * args.batch
        load(WARMUP_S, out / "warmup")
        result = load(args.duration, out, csv_prefix=f"{len(nodes)}nodes_b{batch}")
    return {"layout": name, "nodes": nodes, "replica_batch": batch, "users": users, "start_s": round(deploy_s, 1),
            "requests": result.requests, "failures": result.failures, "p50_ms": result.p50_ms,
            "p99_ms": result.p99_ms, "throughput_rps": round(result.throughput_rps, 2)}


def kill_run(args: argparse.Namespace, out: Path) -> dict:
    """The two-node layout under 2B users for --duration seconds: node [1]'s raylet is killed -9 at
    a third of it and started again at two thirds. Failures, and throughput in each third."""
    import threading

    third = args.duration / 3
    with deployed([[0], [1]], args.batch, args) as (cluster, load):
        load(WARMUP_S, out / "warmup")
        events = {}

        def chaos() -> None:
            time.sleep(third)
            events["killed"] = time.time()
            cluster.kill_node([1])
            time.sleep(third)
            events["restarted"] = time.time()
            cluster.add_node([1])

        thread = threading.Thread(target=chaos)
        thread.start()
        result = load(args.duration, out, csv_prefix="kill")
        thread.join()
    phases = {"before": (0, events["killed"]), "one node": (events["killed"], events["restarted"]),
              "after restart": (events["restarted"], float("inf"))}
    throughput = {name: _mean(r.rps for r in result.history if lo <= r.timestamp < hi) for name, (lo, hi) in phases.items()}
    failures_at = [round(r.timestamp - events["killed"]) for r in result.history if r.failures_per_s > 0]
    return {"requests": result.requests, "failures": result.failures, "seconds_after_kill_with_failures": failures_at,
            "throughput_rps": throughput, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms}


def _mean(values) -> float:
    values = list(values)
    return round(statistics.mean(values), 2) if values else float("nan")


def summary(rows: list[dict]) -> str:
    cells = []
    for layout in LAYOUTS:
        mine = [r for r in rows if r["layout"] == layout]
        if not mine:
            continue
        median = {key: statistics.median(r[key] for r in mine) for key in ("p50_ms", "p99_ms", "throughput_rps")}
        cells.append([layout, mine[0]["users"], f"{median['p50_ms']:.0f}", f"{median['p99_ms']:.0f}",
                      f"{median['throughput_rps']:.2f}", sum(r["failures"] for r in mine), len(mine)])
    return markdown_table(["layout", "users", "p50 ms", "p99 ms", "throughput req/s", "failures", "rounds"], cells)


def main() -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default="resnet50", help="zoo model (default: resnet50)")
    parser.add_argument("--profile", type=Path, required=True, help="a profile with 1- and 2-thread points")
    parser.add_argument("--batch", type=int, default=4, help="B, each replica's batch; 2B users (default: 4)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load per layout and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every layout (default: 2)")
    parser.add_argument("--out", type=Path, default=Path("out/ray_nodes"), help="output folder (default: out/ray_nodes)")
    parser.add_argument("--kill", action="store_true",
                        help="instead: two nodes under load, node [1]'s raylet killed -9 at a third of --duration "
                             "and restarted at two thirds; failures and throughput per phase")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.kill:
        result = kill_run(args, args.out)
        write_json(args.out / "ray_kill.json", result)
        print(json.dumps(result))
        return 0
    rows = []
    for round_index, name in in_rounds(list(LAYOUTS), args.rounds):  # each round in a rotated order
        nodes, multiple = LAYOUTS[name]
        rows.append({**run_layout(name, nodes, multiple * args.batch, args, args.out / f"round{round_index - 1}"),
                     "round": round_index - 1})
        print(json.dumps(rows[-1]), flush=True)
    write_json(args.out / "ray_nodes.json", rows)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
