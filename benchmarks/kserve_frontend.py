"""The KServe front end against TorchServe with the packrat handler (issue 43): the same plan and bodies.

For each model (--models) and batch size B (--batches): one archive with the plan for B, fixed (no
reconfiguration, no node sharing, TorchServe's batch delay --max-batch-delay), served side by side
by TorchServe with the packrat handler and by the KServe model server (`packrat serve --engine
kserve`'s, packrat/deploy/kserve.py), both on free loopback ports, and run by the same engine in
this process (the pool's own: no HTTP, no front end). Each is warmed up; then --rounds
interleaved rounds, each running every case (front end, users) for --duration s in an order
rotated every round. Users: 1 and B closed-loop users. The front ends are loaded by locust
(POST /predictions/MODEL with the model's natural payload: a JPEG for image models), the pool by
as many threads calling the engine; locust and the threads share the machine's cores with the
servers.

Per case, pooled over the rounds: requests, failures, p50, p99 and req/s; for each front end its
per-request cost over the pool's own: its p50 minus the pool's p50 at the same users.
--kill-every S also kills -9 one pool instance of the KServe server every S s while it is
measured (the chaos run): its failures are in the table.

Output: the markdown table (stdout), OUT/kserve-frontend.json with every figure.
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

from packrat.bench.harness import doc_parser
from packrat.bench.results import fmt_num, markdown_table, write_json
from packrat.bench.rounds import in_rounds
from packrat.bench.users import EngineUsers

EXAMPLES = """examples:
  python benchmarks/kserve_frontend.py --models squeezenet,resnet50 --batches 1,4 \\
      --profile squeezenet=profiles/squeezenet.csv --profile resnet50=profiles/resnet50.csv \\
      --duration 20 --rounds 3 --out out/kserve-frontend
  python benchmarks/kserve_frontend.py --models squeezenet --batches 4 --profile squeezenet=profiles/squeezenet.csv \\
      --front-ends kserve --duration 60 --rounds 1 --kill-every 3 --out out/kserve-chaos"""
WARMUP_S = 8.0
FRONT_ENDS = ("kserve", "torchserve", "pool")


def parse_args(argv=None):
    p = doc_parser(__doc__, EXAMPLES)
    p.add_argument("--models", default="squeezenet,resnet50", help="zoo models, comma-separated")
    p.add_argument("--batches", default="1,4", help="batch sizes B the plans are for (default: 1,4)")
    p.add_argument("--profile", action="append", default=[], metavar="MODEL=PATH",
                   help="each model's profile (default: profiles/MODEL.csv, measured there if missing)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load per case and round (default: 20)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument("--max-batch-delay", type=int, default=50, metavar="MS",
                   help="TorchServe's batch delay, and the engine's gather wait (default: 50)")
    p.add_argument("--front-ends", default=",".join(FRONT_ENDS),
                   help=f"which to run, of {','.join(FRONT_ENDS)} (default: all; the cost column needs pool)")
    p.add_argument("--kill-every", type=float, default=None, metavar="S",
                   help="kill -9 a pool instance of the KServe server every S s while it is loaded")
    p.add_argument("--out", type=Path, default=Path("out/kserve-frontend"))
    return p.parse_args(argv)


# ---- the three ways to serve one archive -----------------------------------------------------------

@contextmanager
def torchserve_server(model: str, mar: Path, run_dir: Path, users: int, body):
    from packrat.bench.servers import warmed_server

    with warmed_server("torchserve", model, mar, run_dir, users, WARMUP_S, log, body) as (server, token):
        yield lambda n, seconds, where, kill: load(server.inference_url, model, n, seconds, where, body, token)


@contextmanager
def kserve_server(model: str, mar: Path, run_dir: Path, users: int, body):
    from packrat.bench.faults import InstanceKiller
    from packrat.bench.servers import kserve_serving

    with kserve_serving(model, mar, run_dir, log) as server:
        load(server.url, model, users, WARMUP_S, run_dir / "warmup", body)

        def run(n, seconds, where, kill):
            with InstanceKiller(server.pid, kill) if kill else nullcontext() as killer:
                result = load(server.url, model, n, seconds, where, body)
            return result, (killer.kills if killer else 0)

        yield run


@contextmanager
def pool_in_process(model: str, mar: Path, run_dir: Path, users: int, body):
    """The archive's engine in this process, as the KServe server builds it, loaded by threads."""
    import zipfile

    from packrat.frontends.kserve_server import archive_settings
    from packrat.serving.engine import Engine

    import os

    from packrat.settings import SERVED_DIR_ENV

    log("-- pool: starting the engine in this process")
    os.environ[SERVED_DIR_ENV.name] = str(run_dir / "served")  # as the servers': not the user's corrections
    unpacked = run_dir / "unpacked"
    with zipfile.ZipFile(mar) as packed:
        packed.extractall(unpacked)
    settings = archive_settings(unpacked)
    engine = Engine(settings, unpacked, model, max_batch=settings.max_batch, asynchronous=True)
    try:
        closed_loop(engine, users, WARMUP_S, body)
        yield lambda n, seconds, where, kill: closed_loop(engine, n, seconds, body)
    finally:
        engine.close()


def load(url: str, model: str, users: int, seconds: float, where: Path, body, token: str | None = None):
    from packrat.loadtest import run_locust

    return run_locust(url, model, users, seconds, where, token=token, payload=body)


def closed_loop(engine, users: int, seconds: float, body) -> dict:
    """`users` threads, each submitting the body and waiting for its answer, for `seconds`."""
    with EngineUsers(engine, users, body) as load:
        time.sleep(seconds)
    return {"latencies_ms": load.latencies_ms, "failures": load.failures, "seconds": seconds}


# ---- one model at one batch size -------------------------------------------------------------------

def bench_batch(model: str, batch: int, profile: Path, args, out: Path) -> list[dict]:
    from packrat.bench.servers import config_archive
    from packrat.codec.payloads import build_payload

    body = build_payload(model)
    mar = config_archive(("kserve-vs-torchserve", "packrat", "auto"), model, batch, profile, out / "model_store",
                         max_batch_delay_ms=args.max_batch_delay)
    users = sorted({1, batch})
    starts = {"kserve": kserve_server, "torchserve": torchserve_server, "pool": pool_in_process}
    measured: dict[tuple[str, int], list] = {}
    with ExitStack() as stack:
        chosen = [name for name in FRONT_ENDS if name in args.front_ends.split(",")]
        runners = {name: stack.enter_context(starts[name](model, mar, out / name, batch, body)) for name in chosen}
        cases = [(name, n) for name in chosen for n in users]
        for round_, (name, n) in in_rounds(cases, args.rounds):
            kill = args.kill_every if name == "kserve" else None
            log(f"-- {model} B={batch}: {name}, {n} user(s), round {round_}/{args.rounds}")
            outcome = runners[name](n, args.duration, out / name / f"u{n}-r{round_}", kill)
            measured.setdefault((name, n), []).append(outcome)
    return rows(model, batch, measured, args.duration)


def rows(model: str, batch: int, measured: dict, seconds: float) -> list[dict]:
    """One row per case, its rounds pooled; front ends with their p50 over the pool's."""
    found = {}
    for (name, users), outcomes in measured.items():
        found[(name, users)] = {"model": model, "batch": batch, "front_end": name, "users": users,
                                **(pool_figures(outcomes) if name == "pool" else server_figures(outcomes, seconds))}
    for (name, users), row in found.items():
        pool = found.get(("pool", users))
        if name != "pool" and pool and row["p50_ms"] is not None:
            row["cost_ms"] = row["p50_ms"] - pool["p50_ms"]
    return list(found.values())


def server_figures(outcomes: list, seconds: float) -> dict:
    from packrat.bench.users import pooled

    results = [o[0] if isinstance(o, tuple) else o for o in outcomes]
    kills = sum(o[1] for o in outcomes if isinstance(o, tuple))
    load = pooled(results, seconds)
    return {"requests": load.requests, "failures": load.failures, "p50_ms": load.p50_ms, "p99_ms": load.p99_ms,
            "rps": load.throughput_rps, "kills": kills,
            "round_p50_ms": [r.p50_ms for r in results]}


def pool_figures(outcomes: list[dict]) -> dict:
    latencies = sorted(x for o in outcomes for x in o["latencies_ms"])
    seconds = sum(o["seconds"] for o in outcomes)
    pick = (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]) if latencies else (lambda q: None)
    return {"requests": len(latencies), "failures": sum(o["failures"] for o in outcomes), "p50_ms": pick(0.5),
            "p99_ms": pick(0.99), "rps": len(latencies) / seconds, "kills": 0,
            "round_p50_ms": [statistics.median(o["latencies_ms"]) for o in outcomes if o["latencies_ms"]]}


def table(all_rows: list[dict]) -> str:
    header = ["model", "B", "users", "front end", "requests", "failed", "p50 ms", "p99 ms", "req/s",
              "p50 over the pool's, ms", "kills"]
    return markdown_table(header, [[r["model"], r["batch"], r["users"], r["front_end"], r["requests"], r["failures"],
                                    fmt_num(r["p50_ms"]), fmt_num(r["p99_ms"]), fmt_num(r["rps"]),
                                    fmt_num(r.get("cost_ms")), r["kills"] or ""] for r in all_rows])


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def main(argv=None) -> int:
    from packrat.profiling.default_profile import resolve_profile

    args = parse_args(argv)
    profiles = dict(entry.split("=", 1) for entry in args.profile)
    all_rows = []
    for model in args.models.split(","):
        batches = [int(b) for b in args.batches.split(",")]
        given = profiles.get(model)
        profile = resolve_profile(model, Path(given) if given else None, batch_sizes=batches)
        for batch in batches:
            all_rows += bench_batch(model, batch, Path(profile), args, args.out / model / f"B{batch}")
    text = table(all_rows)
    print(text)
    write_json(args.out / "kserve-frontend.json", {"args": {k: str(v) for k, v in vars(args).items()},
                                                   "rows": all_rows, "markdown": text})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
