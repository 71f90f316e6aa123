"""What planning for the CPU quota buys: a plan for the affinity's cores against a plan for the
budget, both run under a real CFS quota.

As root on a cgroup v1 machine (this one), it makes /sys/fs/cgroup/cpu/packrat-bench-quota with a
quota of --quota cores and runs itself inside it (`--inside`). There it plans twice from the same
profile: for the cores the affinity shows (what packrat did before it read quotas, and what a
container with `docker --cpus` or a pod's `limits.cpu` shows) and for the CPU budget
(packrat/machine/budget.py, cut to the quota). Both pools answer batches of B raw-tensor requests in
alternating rounds, one pool at a time, each answering batches back to back for --seconds (a
burst shorter than the quota's period is not throttled; a sustained load is); it prints each
plan's median batch latency and throughput, and the latency ratio.

    python benchmarks/cpu_quota.py --model resnet50 --profile out/bench17/resnet50-compile.csv \
        --batch 4 --quota 1 --rounds 2 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import ROOT, answered, child_json, doc_parser, elapsed_ms, pool_requests, write_json

CGROUP = Path("/sys/fs/cgroup/cpu/packrat-bench-quota")
PERIOD_US = 100_000


def inside(args: argparse.Namespace) -> dict:
    """Run in the cgroup: both plans' pools, interleaved; their medians."""
    from packrat.machine.budget import cpu_budget
    from packrat.models.modes import served
    from packrat.models.zoo import resolve
    from packrat.planning.planner import serving_plan
    from packrat.serving.pool.instance_pool import InstancePool
    from packrat.serving.pool.api import ModelConfig
    from packrat.profiling.profiles import load
    from packrat.machine.topology import detect

    profile = load(args.profile)
    items, mode = profile.items(), served(profile.metadata.get("mode"))
    budget, affinity = cpu_budget(), detect()
    plans = {"affinity": serving_plan(items, affinity.num_cores, args.batch, affinity, "auto")[0],
             "budget": serving_plan(items, budget.cores, args.batch, budget.topology, "auto")[0]}
    requests = pool_requests(resolve(args.model), args.batch)
    config = ModelConfig(args.model, graph_mode=mode)
    latencies: dict[str, list[float]] = {name: [] for name in plans}
    served = {name: 0.0 for name in plans}  # requests per second, summed over rounds
    for _ in range(args.rounds):
        for name, plan in plans.items():
            # One pool at a time: an idle pool's OpenMP threads spin, and that would eat the quota.
            with InstancePool.from_plan(config, plan) as pool:
                answered(pool, requests)  # warm-up
                started, count = time.monotonic(), 0
                while time.monotonic() - started < args.seconds:
                    latencies[name].append(elapsed_ms(lambda: answered(pool, requests)))
                    count += 1
                served[name] += count * len(requests) / (time.monotonic() - started)
    medians = {name: statistics.median(values) for name, values in latencies.items()}
    throughput = {name: total / args.rounds for name, total in served.items()}
    return {"model": args.model, "batch": args.batch, "quota_cores": args.quota, "budget": budget.describe(),
            "plans": {name: plan.describe() for name, plan in plans.items()}, "median_ms": medians,
            "throughput_rps": throughput, "affinity_over_budget": medians["affinity"] / medians["budget"],
            "rounds": args.rounds, "seconds": args.seconds}


def run_in_cgroup(args: argparse.Namespace) -> dict:
    CGROUP.mkdir(exist_ok=True)
    try:
        (CGROUP / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (CGROUP / "cpu.cfs_quota_us").write_text(str(int(args.quota * PERIOD_US)))
        tasks = CGROUP / "tasks"
        cmd = [sys.executable, __file__, "--inside", *sys.argv[1:]]
        return child_json(cmd, check=True, cwd=ROOT, preexec_fn=lambda: tasks.write_text(str(os.getpid())))
    finally:
        time.sleep(0.5)  # the child's instances have exited; the cgroup must be empty to go
        CGROUP.rmdir()


def main() -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default="resnet50", help="zoo model (default: resnet50)")
    parser.add_argument("--profile", type=Path, required=True, help="the profile both plans come from")
    parser.add_argument("--batch", type=int, default=4, help="B, the requests per batch (default: 4)")
    parser.add_argument("--quota", type=float, default=1.0, help="the CFS quota, in cores (default: 1)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both plans, alternating (default: 2)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="seconds of back-to-back batches per plan and round: long enough for the quota to bind")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here too")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        print(json.dumps(inside(args)))
        return 0
    if os.geteuid() != 0 or not CGROUP.parent.is_dir():
        print("needs root and a cgroup v1 cpu controller at /sys/fs/cgroup/cpu", file=sys.stderr)
        return 2
    result = run_in_cgroup(args)
    if args.out:
        write_json(args.out, result)
    m = result["median_ms"]
    print(f"{args.model} B={args.batch} under a {args.quota:g}-core quota; {result['budget']}")
    for name in ("affinity", "budget"):
        print(f"  plan for the {name:<8}  {result['plans'][name]:<28} {m[name]:8.1f} ms  "
              f"{result['throughput_rps'][name]:6.2f} req/s")
    print(f"  affinity / budget: {result['affinity_over_budget']:.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
