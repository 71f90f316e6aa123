"""Measure one profile point, L(t, b), in this (fresh) process, pinned to --cores before torch is
imported (so OpenMP's threads start on the right cores).

``python -m packrat.profiling.point --model M --threads T --batch B --cores 0,1 ...`` prints one JSON
line with the statistics (measuring.measure_point); with ``--prepare-only`` it only loads the model as
the point runs it (an IOS schedule searched, a package built: builds.py) and prints its mode.

With ``--loaded`` it is one of measuring.Workers' copies, run side by side in lockstep as a plan's
instances run a batch: it says ``ready`` and a JSON object (mode, cores) once started (and, with
--batch, loaded and warm); a ``batch N`` line makes it a point of batch N (its package or compiled
model loaded, its served batch laid out, warmed up) and it says ``ready`` again; each ``run`` line
runs the model once and prints its time in ms; it exits when stdin closes.

With ``--thread-copies 0,1;2,3`` the point is a thread-kind runtime's (onnxruntime-thread), measured
as the pool serves such instances: one session per core set, each loaded on a thread of this one
process pinned to its cores (the process to all of them, --cores), run together in rounds timed as
the copies' are. It says ``ready``, then measures a point per ``batch N [K]`` line (the first K
sessions; all by default) and prints its JSON line, with what the kernel says of the sessions' threads.

With ``--payload KIND`` (jpeg, text, raw, or natural: the model's own) the point also measures its
served figure after the model's: `batch` copies of one request body answered as a pool instance
answers them (ServedBatch); a reply other than 200 fails the point. Loaded, a ``serve`` line runs
one served batch as ``run`` runs the model (its ms, then its stages').
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import NamedTuple

from packrat.models.modes import DEFAULT_MODE, MODES
from packrat.models.runtimes import DEFAULT_RUNTIME, RUNTIMES
from packrat.profiling.costs import SERVED_WARMUP, enough_runs

PAYLOADS = ("natural", "jpeg", "text", "raw")  # --payload: what a served point answers


def run_once(module, examples: tuple) -> float:
    """One call of the model, in inference mode (entered before the clock starts): its time in ms."""
    import torch

    with torch.inference_mode():
        t0 = time.perf_counter()
        module(*examples)
        return (time.perf_counter() - t0) * 1e3


def budgeted(run, iters: int | None, min_time: float | None, max_runs: int | None = None,
             precision: float | None = None) -> list:
    """What `run()` returns (its ms, or its ms first in a tuple), called `iters` times or until
    costs.enough_runs: the budget of every timed figure of a point."""
    results, times = [], []
    start = time.perf_counter()
    while True:
        results.append(run())
        times.append(results[-1][0] if isinstance(results[-1], tuple) else results[-1])
        if iters is not None:
            if len(results) >= iters:
                return results
        elif enough_runs(times, time.perf_counter() - start, min_time, max_runs, precision):
            return results


def serve_runs(args: argparse.Namespace) -> None:
    """The --loaded protocol (the module's docstring): ready, then `batch N`, `run` and `serve` lines."""
    import torch

    point = _warm(args) if args.batch else None
    print("ready " + json.dumps(point[2] if point else {"torch_threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        command, _, number = line.strip().partition(" ")
        if command == "batch":
            args.batch, point = int(number), None  # the last point's model is let go before the next loads
            point = _warm(args)
            print("ready " + json.dumps(point[2]), flush=True)
        elif command == "serve" and point and point[3] is not None:
            ms, stages = point[3].run(point[0])
            print(" ".join(f"{x:.4f}" for x in (ms, *stages)), flush=True)
        elif command == "run" and point:
            print(f"{run_once(point[0], point[1]):.4f}", flush=True)
        else:
            return


def _warm(args: argparse.Namespace) -> tuple:
    """(module, examples, actual, ServedBatch or None) of args.batch, warmed up by --warmup runs (one
    after the process's first point): `actual` (mode, cores, torch threads) shows the pinning took."""
    import torch

    module, examples, mode, served = _prepare(args)
    actual = {"mode": mode, "cores": sorted(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads()}
    runs = 1 if args.warmed else args.warmup
    for _ in range(runs):
        run_once(module, examples)
    for _ in range(min(SERVED_WARMUP, runs) if served else 0):
        served.run(module)
    args.warmed = True
    return module, examples, actual, served


class ServedFailed(RuntimeError):
    """A served batch answered a request with another status than 200: the point is not timed."""


class ServedBatch:
    """One sub-batch of `batch` requests, each `body`, as a pool instance serves it: laid out in one
    buffer as the pool's parent lays them (Instance.submit: input rows first, a raw one-sample body
    straight into its row, others after them) and answered with answer_batch on its decoders."""

    def __init__(self, codec, decoders, body: bytes, content_type: str, batch: int):
        from packrat.codec.rows import InputRows, RowsLayout

        self.codec, self.decoders = codec, decoders
        layout = RowsLayout.of(codec.config, batch)
        places, end = [], layout.size
        for index in range(batch):  # a body of one sample of the first input goes straight into its row
            if len(body) == layout.row_bytes:
                places.append(layout.row_offset(index))
            else:
                places.append(end)
                end += len(body)
        view = memoryview(bytearray(end))
        self.body, self.places, self.view = body, places, view
        self.rows = InputRows(codec.config, layout, view)
        self.bodies = [(view[place:place + len(body)], content_type, None) for place in places]
        self.in_rows = frozenset(index for index, place in enumerate(places)
                                 if place == layout.row_offset(index) and len(body) == layout.row_bytes)

    def run(self, module) -> tuple[float, list[float]]:
        """Answer the batch once, from the bodies' copy into the buffer on (the pool's parent makes it
        before the instance starts): its time in ms, and its stages' (decode, model, encode) in ms.
        ServedFailed when a reply is not 200."""
        from packrat.codec.batch import answer_batch

        t0 = time.perf_counter()
        for place in self.places:  # the parent's one copy of each body into the segment, on the batch's path
            self.view[place:place + len(self.body)] = self.body
        laps = [time.monotonic()]
        replies = answer_batch(module, self.codec, self.bodies,
                               self.decoders.mapper(len(self.bodies) - len(self.in_rows)), laps, self.rows,
                               self.in_rows)
        elapsed = (time.perf_counter() - t0) * 1e3
        failed = [(index, reply) for index, reply in enumerate(replies) if reply.status != 200]
        if failed:
            index, reply = failed[0]
            raise ServedFailed(f"served batch: {len(failed)} of {len(replies)} requests failed; request {index} "
                               f"answered {reply.status}: {reply.reason}")
        return elapsed, [(b - a) * 1e3 for a, b in zip(laps, laps[1:])]


def time_served(serve, warmup: int, *budget) -> dict:
    """The served figure's statistics (served_ms, served_mad_ms, ...) and its stages' mean ms over
    budgeted() runs of `serve()` (its ms and its stages' ms), after `warmup` untimed ones."""
    for _ in range(warmup):
        serve()
    samples, stages = zip(*budgeted(serve, *budget))
    means = [statistics.fmean(column) for column in zip(*stages)]
    stats = summarize(list(samples))  # its keys named served_*: served_ms the mean
    return {"served_ms": stats.pop("latency_ms"), **{f"served_{key}": value for key, value in stats.items()},
            **{f"served_{stage}_ms": ms for stage, ms in zip(("decode", "model", "encode"), means)}}


def summarize(samples: list[float]) -> dict[str, float | int]:
    ordered = sorted(samples)
    p99_index = min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))
    return {"latency_ms": statistics.fmean(ordered), "p50_ms": statistics.median(ordered), "p99_ms": ordered[p99_index],
            "std_ms": statistics.pstdev(ordered), "iterations": len(ordered), "mad_ms": robust_spread(ordered)}


def robust_spread(samples: list[float]) -> float:
    """1.4826 x the median absolute deviation (the std, for normal noise): a VM's few slow runs
    inflate the std and once kept a slower runtime (docs/benchmarks/peers.md)."""
    middle = statistics.median(samples)
    return 1.4826 * statistics.median(abs(x - middle) for x in samples)


class _Session(NamedTuple):
    """One thread-kind session of a --thread-copies point: its pinned thread and what it runs."""
    worker: object  # machine.threads.PinnedWorker
    pinned: list[int]  # the cores its thread ran on when it began loading (its core set, if the pinning took)
    module: object
    examples: tuple
    mode: str
    served: "ServedBatch | None"


def thread_copies(args: argparse.Namespace, core_sets: list[list[int]]) -> None:
    """--thread-copies: a thread pinned to each core set; a point measured (measure_threads) and printed
    per `batch N [K]` line, on the first K (all by default)."""
    from packrat.machine.threads import PinnedWorker

    workers = [PinnedWorker(cores, f"packrat-point-{index}") for index, cores in enumerate(core_sets)]
    print("ready " + json.dumps({"cores": sorted(os.sched_getaffinity(0))}), flush=True)
    for line in sys.stdin:
        command, *numbers = line.split()
        if command != "batch":
            return
        args.batch = int(numbers[0])
        print(json.dumps(measure_threads(args, workers[:int(numbers[1])] if numbers[1:] else workers)), flush=True)


def measure_threads(args: argparse.Namespace, workers: list) -> dict:
    """A thread-kind point as the pool serves it: a session per worker (a pinned thread), timed in
    rounds run by all together; a round's time is the slowest session's own (the GIL waits in it,
    the hand-off to the threads not: a process copy times itself too; issue 63)."""
    sessions = [_start_session(args, worker) for worker in workers]
    _round(sessions, lambda s: [run_once(s.module, s.examples) for _ in range(args.warmup)])
    def slowest_round() -> tuple[float, list[float]]:
        times = _round(sessions, lambda s: run_once(s.module, s.examples))[1]
        return max(times), times

    timed = budgeted(slowest_round, *args.budget)
    own = [ms for _, times in timed for ms in times]
    result = {**summarize([slowest for slowest, _ in timed]), "copy_ms": statistics.fmean(own),
              "mode": sessions[0].mode,
              "copies": len(sessions), "copy_cores": [s.pinned for s in sessions], **_threads_seen(sessions)}
    if args.payload:
        result.update(time_served(lambda: _served_round(sessions), min(SERVED_WARMUP, args.warmup), *args.budget))
    return result


def _start_session(args: argparse.Namespace, worker) -> _Session:
    """A session loaded on `worker` (a thread pinned to its cores), in a pool thread instance's order:
    its decoders and session started there (inheriting its cores), then the thread pinned to the first."""
    from packrat.machine.threads import pin_thread

    cores = list(worker.cores)  # a session before pinned the thread to its first core: all of them again
    pinned = worker.call(lambda: (pin_thread(cores), sorted(os.sched_getaffinity(0)))[1]).result()
    return _Session(worker, pinned, *worker.call(lambda: _prepare(args, cores)).result())


def _round(sessions: list[_Session], run) -> tuple[float, list]:
    """`run(session)` on every session's thread at once: the wall time in ms until all are done, and
    what each returned."""
    started = time.perf_counter()
    futures = [s.worker.call(lambda s=s: run(s)) for s in sessions]
    results = [future.result() for future in futures]
    return (time.perf_counter() - started) * 1e3, results


def _served_round(sessions: list[_Session]) -> tuple[float, list[float]]:
    """A served batch on every session at once: the slowest session's own time (measure_threads) and
    the sessions' mean stages."""
    _, runs = _round(sessions, lambda s: s.served.run(s.module))
    return max(ms for ms, _ in runs), [statistics.fmean(column) for column in zip(*(stages for _, stages in runs))]


def _threads_seen(sessions: list[_Session]) -> dict:
    """What the kernel says of this process and its sessions' threads (/proc/self/task), so a caller
    can check they were threads of this one process, pinned as the pool pins them."""
    from packrat.machine.threads import task_affinities

    tasks = task_affinities()
    ids = [s.worker.native_id for s in sessions]
    return {"pid": os.getpid(), "process_cores": sorted(os.sched_getaffinity(0)), "session_threads": ids,
            "session_cores": [sorted(tasks[i][1]) if i in tasks else None for i in ids]}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--input-shape", default=None)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--batch", type=int, default=None, help="required but with --loaded or --thread-copies")
    parser.add_argument("--cores", required=True, help="comma-separated CPU ids")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--min-time", type=float, default=None)
    parser.add_argument("--max-runs", type=int, default=None, help="with --min-time: at most this many runs")
    parser.add_argument("--precision", type=float, default=None,
                        help="with --min-time: stop once the mean is known within this share (costs.enough_runs)")
    parser.add_argument("--graph-mode", default=DEFAULT_MODE, choices=MODES)
    parser.add_argument("--runtime", default=DEFAULT_RUNTIME, choices=RUNTIMES, help="inductor: torch, in --graph-mode")
    parser.add_argument("--ios-cache", default=None,
                        help="where the ios runtime's schedules are kept (searched there when missing)")
    parser.add_argument("--prepare-only", action="store_true", help="load the model as the point runs it, print "
                        "its mode and exit: an IOS schedule searched, a package built, alone")
    parser.add_argument("--payload", default=None, choices=PAYLOADS, help="also measure the served figure "
                        "(natural: the model's own payload)")
    parser.add_argument("--thread-copies", default=None, metavar="SETS", help="a thread-kind runtime's "
                        "point: a session per core set (';'-separated, e.g. 0;1), told its batches on stdin")
    parser.add_argument("--loaded", action="store_true", help="one of measuring.Workers' copies, told what "
                        "to run on stdin")
    return parser


def _spec(args: argparse.Namespace):
    from packrat.models.zoo import resolve

    shape = tuple(int(x) for x in args.input_shape.split(",")) if args.input_shape else None
    return resolve(args.model, shape)


def _prepare(args: argparse.Namespace, cores=None) -> tuple:
    """(module, example inputs, mode, ServedBatch with --payload or None) for the point, built after
    torch's thread settings; `cores`: a thread-kind session's (it runs on the calling thread, pinned to
    them). --prepare-only loads the model alone."""
    if args.payload and not args.prepare_only:
        return _prepare_served(args, cores)
    import torch

    from packrat.codec.codec import Codec
    from packrat.codec.config import CodecConfig

    torch.set_num_threads(args.threads)
    spec = _spec(args)
    image = Codec(CodecConfig.for_model(spec)).input_kind == "image"  # an instance of it has decoders
    return (*_load(args, spec, cores, stop_spinning=image and args.threads > 1), None)


def _prepare_served(args: argparse.Namespace, cores=None):
    """(module, example inputs, mode, ServedBatch) for a served point, with the codec, decoders and
    thread counts set in a pool instance's order (packrat/serving/pool/child.py main())."""
    from packrat.codec.batch import Decoders, set_intra_op_threads
    from packrat.codec.codec import Codec
    from packrat.codec.config import CodecConfig
    from packrat.codec.payloads import check_payload_of, payload_of, served_payload
    from packrat.models.runtimes import torch_threads

    spec = _spec(args)
    codec = Codec(CodecConfig.for_model(spec))
    kind = served_payload(spec) if args.payload == "natural" else args.payload
    check_payload_of(spec, kind, args.model)
    decoders = Decoders(args.threads if codec.input_kind == "image" else 1)
    set_intra_op_threads(args.threads)
    module, examples, mode = _load(args, spec, cores, decoders.parallel)
    set_intra_op_threads(torch_threads(mode, args.threads))
    return module, examples, mode, ServedBatch(codec, decoders, *payload_of(spec, kind), args.batch)


def _load(args: argparse.Namespace, spec, cores=None, stop_spinning: bool = True):
    """(module, example inputs, mode): the model as the point runs it, as an instance with the same
    decoders would (`stop_spinning`, prepare_runtime). A thread-kind session's intra-op threads are
    pinned to `cores` but the first, where the calling thread then stays."""
    from packrat.models.zoo import prepare

    if args.runtime != DEFAULT_RUNTIME:
        from packrat.machine.threads import pin_thread
        from packrat.models.runtimes import prepare_runtime

        # the search before a point's copies (--prepare-only) finishes a schedule cut short before
        module, examples = prepare_runtime(spec, args.runtime, args.batch, args.threads, ios_cache=args.ios_cache,
                                           cores=cores, finish_ios=args.prepare_only, ladder=False,
                                           stop_spinning=stop_spinning)
        if cores:
            pin_thread(cores[:1])
        return module, examples, args.runtime
    return prepare(spec, args.batch, graph_mode=args.graph_mode, ladder=False)  # every call has args.batch samples


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.warmed = False  # _warm: the first point of this process warms up by --warmup runs, later ones by one
    args.budget = (args.iters, args.min_time, args.max_runs, args.precision)  # the timed runs' budget, as budgeted() takes it
    if args.batch is None and not (args.loaded or args.thread_copies):
        parser.error("--batch is required (but with --loaded or --thread-copies)")
    os.sched_setaffinity(0, [int(c) for c in args.cores.split(",")])
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_interop_threads(1)
    if args.prepare_only:
        print(json.dumps({"mode": _prepare(args)[2]}), flush=True)
    elif args.thread_copies:
        thread_copies(args, [[int(c) for c in part.split(",")] for part in args.thread_copies.split(";")])
    elif args.loaded:
        serve_runs(args)
    else:
        module, examples, actual, served = _warm(args)
        result = {**summarize(budgeted(lambda: run_once(module, examples), *args.budget)), **actual}
        if served is not None:
            result.update(time_served(lambda: served.run(module), 0, *args.budget))
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    # Measured and said: exit now; the orderly shutdown with torch loaded took half a second a point.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
