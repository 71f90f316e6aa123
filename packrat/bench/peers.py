"""Packrat's plan against what users would pick instead, side by side, on the same cores.

One zoo model at each batch size B of --batches, on T cores; every peer answers the same B samples
with all T cores:

  packrat              the plan for (T, B) from the profile, served by an InstancePool without
                       TorchServe (raw tensor bytes); skipped at a B the profile cannot plan
  packrat-later        the same, planned on --later-profile or as --served-corrections corrected it
  fat                  the same pool with one inductor instance ⟨T, B⟩: the pool's own overhead
  eager, script        PyTorch eager; TorchScript (trace, freeze, optimize_for_inference)
  compile              packrat's compile mode, as its instances run it (AOTInductor packages)
  torch-compile        what a user writes: torch.compile(module, dynamic=False), freezing on
  openvino-latency     packrat's IR, static batch B, PERFORMANCE_HINT LATENCY, T threads
  openvino-throughput  batch 1 with PERFORMANCE_HINT THROUGHPUT: B requests on an AsyncInferQueue
  onnxruntime          packrat's ONNX file, intra_op_num_threads T, ORT_SEQUENTIAL
  onnxruntime-parallel the same in ORT_PARALLEL (--ort-parallel-threads)

Each peer in a pinned process of its own, in --rounds interleaved rounds; per B the median over
rounds and the paired ratio to packrat's, and whether the outputs match eager's (docs/load-testing.md)."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import random
import tempfile
import time
from pathlib import Path

from packrat.bench.harness import MEMORY_RESERVE_MIB, Worker, available_mib, fresh_compile_caches, local_topology
from packrat.bench.peer_runners import POOL_PEERS, ROUND_WARMUP, missing_packages, serve
from packrat.bench.peers_report import add_diffs, markdown, round_line, summarise, verdict_lines
from packrat.bench.results import write_json
from packrat.bench.rounds import grouped_rounds
from packrat.profiling.profiles import default_path as default_profile_path


def pool_plans(args, cores: list[int]) -> dict:
    """For the children: packrat's plan (and packrat-later's), the fat instance per B, the pools' graph mode."""
    from packrat.machine.topology import detect
    from packrat.models.modes import MODES

    topology = detect(set(cores))
    path = args.profile or default_profile_path(args.model)
    profile, why = read_profile(args, path)
    pools: dict = {"fat": {}, "profile": str(path), "lines": {}}
    mode = args.packrat_mode
    if mode is None:
        mode = (profile.metadata.get("mode") if profile else None) or "compile"
        if mode not in MODES:
            pools["mode_note"] = f"the profile's mode {mode!r} is not served here: its pools run compile"
            mode = "compile"
    pools["mode"] = mode
    if profile is not None:
        pools.update(latency=args.latency or profile.figures[0], metadata=profile.metadata)
    for batch in args.batches:
        fat_ms = profile.isolated.get((len(cores), batch)) if profile is not None else None  # the watchdog's yardstick
        pools["fat"][str(batch)] = {"instances": [{"threads": len(cores), "batch": batch, "cores": cores,
                                                   "expected_ms": fat_ms}]}
    pools["packrat"] = plans_of(args, profile, why, path, cores, topology, pools["lines"], "packrat plan", mode)
    if profile is not None and args.settle_s > 0:
        pools["settled"] = settled_plans(args, profile, topology, mode, pools["packrat"], pools["lines"])
    later_lines: dict = {}
    if args.later_profile:
        later, later_why = read_profile(args, args.later_profile)
        if later is not None and args.served_corrections:  # as that engine plans with it: its corrections
            from packrat.serving.correcting import PlanCorrector  # and the figures inferred from them

            if not args.served_corrections.exists():
                raise SystemExit(f"packrat bench peers: no served-latency file {args.served_corrections}")
            later = PlanCorrector(later, args.served_corrections, keep=False).profile
            pools["served_corrections"] = str(args.served_corrections)
        pools["later_profile"] = str(args.later_profile)
        pools["packrat-later"] = plans_of(args, later, later_why, args.later_profile, cores, topology,
                                          later_lines, "packrat-later plan", mode)
    else:
        pools["packrat-later"] = {str(b): {"skipped": "no --later-profile"} for b in args.batches}
    for batch, line in later_lines.items():
        pools["lines"][batch] = "\n\n".join(filter(None, (pools["lines"].get(batch), line)))
    return pools


def settled_plans(args, profile, topology, mode: str, plans: dict, lines: dict) -> dict:
    """packrat's plans as an engine serves them: each B's near-ties timed side by side and the faster taken
    (serving/settling.py) before the peers start. B -> the settlement (JSON)."""
    from packrat.models.zoo import resolve
    from packrat.serving.settling import model_pools, settle_batches

    batches = [b for b in args.batches if "instances" in plans[str(b)]]
    if not batches or (args.latency or profile.figures[0]) != profile.figures[0]:
        return {}  # settling times the plans of the primary figures, as a server plans on them
    pools = model_pools(args.model, mode, max(batches))
    try:
        found = settle_batches(profile, resolve(args.model), pools, topology, batches, args.settle_s,
                               say=lambda line: print(line, flush=True))
    finally:
        pools.close()
    for settlement in found:
        plans[str(settlement.batch)] = pool_plan(settlement.plan)
        lines[settlement.batch] = f"{lines.get(settlement.batch, '')}\n\n{settlement.line()}".strip()
    return {str(s.batch): s.to_json() for s in found}


def pool_plan(plan) -> dict:
    """A plan as the children build its pool: its instances, what it is, its prediction."""
    return {"instances": [{"threads": i.threads, "batch": i.batch, "cores": list(i.cores), "expected_ms": i.latency_ms,
                           "runtime": i.runtime} for i in plan.instances],
            "describe": plan.describe(), "predicted_ms": plan.expected_latency_ms}


def read_profile(args, path: Path):
    """(the profile at `path`, None) or (None, why it cannot be used)."""
    from packrat.errors import ProfileError
    from packrat.profiling.profiles import held
    from packrat.serving.payloads import planned_for

    measure = f"`packrat profile --model {args.model} --batches {','.join(map(str, args.batches))} --out {path}`"
    try:  # the pools answer raw tensors: planned as the engine plans for them
        profile = held(path)
    except ProfileError as exc:
        return None, f"profile unusable: {exc}"
    if profile is None:
        return None, (f"no profile {path}: measure one with {measure} (or give --profile)" if not path.exists()
                      else f"{path} holds no points: measure them with {measure} (it resumes)")
    return planned_for(profile, raw_share=1.0), None


def plans_of(args, profile, why: str | None, path: Path, cores: list[int], topology, lines: dict, name: str,
             mode: str) -> dict:
    """Per B, the plan `profile` gives for all of `cores`, or why none; a line per B into `lines`."""
    from packrat.errors import NoPlanError, ProfileError
    from packrat.planning.planner import Planner

    plans, threads = {}, len(cores)
    for batch in args.batches:
        if profile is None:
            plans[str(batch)] = {"skipped": why}
            continue
        latency = args.latency or profile.figures[0]
        try:
            plan = Planner(profile.items(latency), threads, batch, profile.runtimes).plan(threads, batch, topology)
        except (NoPlanError, ProfileError, ValueError) as exc:
            plans[str(batch)] = {"skipped": f"no plan for B={batch} from {path}: {exc}"}
            lines[batch] = f"{name}: no plan for B={batch} from {path} ({exc})"
            continue
        plans[str(batch)] = pool_plan(plan)
        fat = f"{plan.fat_latency_ms:.1f} ms" if plan.fat_latency_ms else "not profiled"
        lines[batch] = (f"{name}: {plan.describe()}, predicted {plan.expected_latency_ms:.1f} ms "
                        f"(fat ⟨{threads}, {batch}⟩ {fat}; {latency} latencies of {path}, {mode} mode)")
    return plans


def measure(peers: list[str], batches: list[int], rounds: int, ask, rng=None, memory_low=lambda: False,
            say=print, runs: dict | None = None) -> dict:
    """Per B, per peer: its start and interleaved rounds beside packrat into `runs`, in groups where memory runs
    low; `ask(peer, request)` answers in the peer's process ("ended" when it ended)."""
    runs = {} if runs is None else runs
    for batch in batches:
        table = runs[str(batch)] = {}
        if "eager" not in peers and peers:  # outputs to compare with: eager's, untimed
            table["_reference"] = {"start": ask("eager", {"op": "start", "batch": batch}), "rounds": []}
            if "setup_s" in table["_reference"]["start"]:
                ask("eager", {"op": "stop", "batch": batch})

        def start(peer: str, batch=batch, table=table) -> bool:
            answer = table.setdefault(peer, {"rounds": []})["start"] = ask(peer, {"op": "start", "batch": batch})
            say(f"B={batch} {peer}: " + (f"set up in {answer['setup_s']:.1f} s" if "setup_s" in answer
                                         else answer.get("skipped") or answer.get("error", "?")))
            return "setup_s" in answer

        def time_one(peer: str, group: int, r: int, batch=batch, table=table) -> bool:
            answer = ask(peer, {"op": "time", "batch": batch})
            table[peer]["rounds"].append({"group": group, "round": r, **answer})
            return not answer.get("ended")

        anchors = ["packrat"] if "packrat" in peers else []
        grouped_rounds(anchors, [p for p in peers if p not in anchors], start, time_one,
                       lambda peer, batch=batch: ask(peer, {"op": "stop", "batch": batch}), rounds, rng, memory_low,
                       lambda group, r, batch=batch, table=table: say(round_line(batch, group, r, table)))
    return runs


def with_later(peers: list[str], later_profile: Path | None) -> list[str]:
    """The peers to run: packrat-later beside packrat when there is a later profile, never without."""
    peers = [p for p in peers if p != "packrat-later"]
    if later_profile is None:
        return peers
    at = peers.index("packrat") + 1 if "packrat" in peers else 0
    return peers[:at] + ["packrat-later"] + peers[at:]


def run(args) -> int:
    cores = list(local_topology(args.cores, "--cores").cores)
    threads = len(cores)
    if args.served_corrections and args.later_profile is None:  # the same profile, as served
        args.later_profile = args.profile or default_profile_path(args.model)
    peers = with_later(args.peers, args.later_profile)
    skipped = {peer: why for peer in peers if (why := missing_packages(peer))}
    active = [p for p in peers if p not in skipped]
    found = {name: importlib.metadata.version(name) if importlib.util.find_spec(name) else "not installed"
             for name in ("torch", "openvino", "onnxruntime", "onnx", "onnxscript")}
    runs, interrupted = {}, False
    with tempfile.TemporaryDirectory(prefix="packrat-peers-") as scratch:
        env = None if args.keep_caches else fresh_compile_caches(Path(scratch))  # None: this environment's
        config = {"model": args.model, "cores": cores, "iters": args.iters, "warmup": args.warmup,
                  "ort_parallel": [n or threads for n in args.ort_parallel_threads]}
        if any(p in POOL_PEERS for p in active):
            config["pools"] = pool_plans(args, cores)
        workers: dict[str, Worker] = {}

        def ask(peer: str, request: dict) -> dict:
            extra = {}
            if peer in workers and not workers[peer].alive:  # it ended: a fresh one, said in its row
                extra["restarted"] = f"its process was started again at B={request['batch']}: the last had ended"
            if extra or peer not in workers:
                workers[peer] = Worker(serve, peer, config, env=env)
            answer = workers[peer].ask(request, args.timeout)
            return {**answer, **extra, **({"ended": True} if not workers[peer].alive else {})}

        try:
            measure(active, args.batches, args.rounds, ask, random.Random(args.seed),
                    lambda: available_mib() < MEMORY_RESERVE_MIB, lambda line: print(line, flush=True), runs)
        except KeyboardInterrupt:  # what was measured is still reported (the suite's budget ends a run so)
            interrupted = True
        finally:
            for worker in workers.values():
                worker.close()
        add_diffs(runs)
    for table in runs.values():
        table.pop("_reference", None)
    summary = summarise(runs, args.batches, skipped)
    pools = config.get("pools", {})
    header = (f"{args.model}, T = {threads} cores {cores}; torch {found['torch']}, openvino {found['openvino']}, "
              f"onnxruntime {found['onnxruntime']}; each peer started once per B ({args.warmup} warm-up batches), then "
              f"{args.rounds} interleaved round(s), each of {ROUND_WARMUP} untimed and {args.iters} timed batches: medians "
              "over rounds of each round's median; vs packrat = peer / packrat in the same round, median over rounds "
              "(above 1: packrat is faster)" + (f"; {pools['mode_note']}" if pools.get("mode_note") else "")
              + ("; INTERRUPTED: what was measured before" if interrupted else ""))
    predicted = {batch: plan.get("predicted_ms") for batch in args.batches
                 if (plan := pools.get("packrat", {}).get(str(batch), {}))}
    table = markdown(summary, header, pools.get("lines"), predicted)
    print("\n" + table)
    print("\n".join(["", *verdict_lines(summary)]))
    if args.json:
        meta = {"model": args.model, "threads": threads, "cores": cores, "batches": args.batches,
                "rounds": args.rounds, "iters": args.iters, "warmup": args.warmup, "seed": args.seed,
                "peers": peers, "versions": found, "interrupted": interrupted,
                "ort_parallel_threads": config["ort_parallel"],
                "pools": {k: v for k, v in pools.items() if k != "lines"}, "plans": pools.get("lines", {}),
                "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
        write_json(args.json, {"meta": meta, "runs": runs, "summary": summary, "markdown": table})
        print(f"all figures: {args.json}")
    return 130 if interrupted else 0
