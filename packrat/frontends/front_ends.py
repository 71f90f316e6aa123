"""Several front-end processes behind one port, where one event loop cannot keep up with the cores.

The KServe server's process is its front end: one event loop reads, admits, hands off and answers
every request, and its thread instances decode under the same interpreter lock. On a node whose
instances answer more than one front end can (planning/front_ends.py: the plans' capacity against one
front end's ceiling), `--front-ends N|auto` serves through N processes:

- The top process decides how many, binds the REST port once (no other process can take it), and
  becomes their supervisor: it starts N servers, each a process of its own with its own event loop
  and engines, pinned to its own block of the budget's cores (its SMT siblings with it). Each plans
  its instances on its block, as any engine plans on its CPU affinity: no core is planned twice.
  Several models in one server share their block through the node plan, as they share a machine.
- Every server accepts connections from the one listening socket they all inherit: the kernel hands
  a new connection to a process that accepts it, one that is busy accepts later, and one that is
  restarting (or dead) accepts none; a kept-alive connection stays with its server. gRPC: each binds
  the same port (gRPC sets SO_REUSEPORT) and the kernel spreads connections among them.
- The supervisor forwards SIGTERM and SIGINT to the servers and exits once all have; it restarts one
  that exits otherwise (back-off 1 s, doubling to 30 s). A server whose supervisor is gone stops.
- Each server writes where it is into the front-end directory (its index, pid, cores and a loopback
  address of its own); `/status` and `/metrics` answered by any of them hold every server's: each
  model's status in each front end (its plan, its health, its share of a core), each server's
  metrics with a `front_end` label. Readiness is each server's own: a request that reaches a server
  is served by that server's engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packrat.machine.budget import cpu_budget
from packrat.machine.cpu_time import CpuMeter, Sampling
from packrat.machine.threads import parse_cpu_list, pin_process
from packrat.machine.topology import logical_cpus
from packrat.serving.node.files import read_json, write_json
from packrat.planning.front_ends import DEFAULT_CEILING_RPS, FrontEnds, capacity_rps, choose, split_cores
from packrat.settings import SERVED_DIR_ENV

log = logging.getLogger(__name__)
CHOICE_FILE = "front-ends.json"  # in the front-end directory: the top process's choice and its blocks
ENTRY_FILE = "front-end-{}.json"  # each server's place: index, count, pid, cores, url
CEILING_FILE = "front-end-ceiling.json"  # in the served directory: `packrat bench http --ceiling`'s figure
RESTART_S = (1.0, 30.0)  # a server that exited is started again after this, doubling to the second
STOP_S = 60.0  # after SIGTERM, servers still running then are killed
FETCH_TIMEOUT_S = 5.0  # a sibling's /status or /metrics


# ---- the choice ------------------------------------------------------------------------------------

def measured_ceiling(directory: Path | None = None) -> tuple[float, str]:
    """One front end's requests a second per core: `packrat bench http --ceiling`'s figure on this
    machine if it wrote one, else the default; with where it came from."""
    path = Path(directory or SERVED_DIR_ENV.get()) / CEILING_FILE
    try:
        found = json.loads(path.read_text())
        return float(found["rps_per_core"]), f"measured by packrat bench http --ceiling, {found.get('date', '?')}"
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_CEILING_RPS, "packrat's default: no `packrat bench http --ceiling` on this machine"


def write_ceiling(rps_per_core: float, detail: dict, directory: Path | None = None) -> Path:
    path = Path(directory or SERVED_DIR_ENV.get()) / CEILING_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rps_per_core": rps_per_core, "date": time.strftime("%Y-%m-%d %H:%M"), **detail}))
    return path


def model_capacity(settings, model_dir: Path, budget) -> float | None:
    """Requests a second the plan for the model's largest batch answers on the budget's cores (fewer
    where the archive's `cores` setting says so, as its engine plans), by its profile."""
    from packrat.planning.planner import serving_plan
    from packrat.serving.engine import chosen_profile, processes_only, runnable_here

    if settings.cores is not None:
        budget = cpu_budget(settings.cores, "the archive's `cores` setting", topology=budget.topology)
    profile = runnable_here(chosen_profile(settings, model_dir, budget)[0])
    if settings.instance_kind == "process":
        profile = processes_only(profile)
    topology = budget.topology
    plan, _ = serving_plan(profile.items(), topology.num_cores, settings.max_batch, topology, settings.plan,
                           profile.runtimes)
    capacity = capacity_rps((i.batch, i.latency_ms) for i in plan.instances)
    return capacity or None


def capacity_or_none(settings, model_dir: Path, budget) -> float | None:
    """model_capacity, or None (said in the log) where the profile gives none: the engine that
    starts next says what is wrong with it."""
    try:
        return model_capacity(settings, model_dir, budget)
    except Exception as exc:
        log.warning("packrat front ends: no capacity from %s's profile (%s: %s)", model_dir.name, type(exc).__name__, exc)
        return None


def decide(asked: str, models: Sequence[tuple[object, Path]], budget=None) -> FrontEnds:
    """The front ends for `asked` ("auto" or a count) serving `models` ((settings, model dir) each):
    auto weighs the largest capacity of any model's plan (the lightest model sets the need)."""
    budget = budget or cpu_budget()
    ceiling, source = measured_ceiling()
    if str(asked) != "auto":
        return choose(asked, None, ceiling, budget.cores, source)
    capacities = [c for c in (capacity_or_none(s, d, budget) for s, d in models) if c]
    return choose("auto", max(capacities) if capacities else None, ceiling, budget.cores, source)


# ---- this process's place ----------------------------------------------------------------------------

@dataclass
class FrontEnd:
    """This server among the front ends: index of count, its front-end directory (None: no one asked
    where), its cores (None: not pinned), the REST socket it inherited (None: it binds its own)."""

    index: int = 0
    count: int = 1
    directory: Path | None = None
    cores: tuple[int, ...] | None = None
    rest_fd: int | None = None
    url: str | None = None  # where this server alone answers (its own loopback socket; the port's with one)
    meter: CpuMeter | None = field(default=None, repr=False)
    _parent: int = field(default_factory=os.getppid, repr=False)

    @classmethod
    def of(cls, args) -> "FrontEnd":
        """From the server's arguments (--front-end I/N, --front-end-dir, --cores, --rest-fd); pinned
        to its cores, every thread of it, at once."""
        index, count = (int(n) for n in (args.front_end or "0/1").split("/"))
        cores = tuple(sorted(parse_cpu_list(args.cores))) if args.cores else None
        if cores:
            pin_process(cores)
        return cls(index, count, Path(args.front_end_dir) if args.front_end_dir else None, cores, args.rest_fd)

    @property
    def supervised(self) -> bool:
        return self.rest_fd is not None

    def sockets(self, host: str, port: int, backlog: int) -> list[socket.socket] | None:
        """What the REST server listens on: the inherited socket and a loopback one of this server's
        own (None for a lone server: uvicorn binds the port). Writes this server's entry."""
        if not self.supervised:
            self.url = f"http://{reach(host)}:{port}"
            self.write_entry()
            return None
        shared = socket.socket(fileno=self.rest_fd)
        own = socket.create_server(("127.0.0.1", 0), backlog=backlog)
        self.url = f"http://127.0.0.1:{own.getsockname()[1]}"
        self.write_entry()
        return [shared, own]

    def write_entry(self) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        write_json(self.directory / ENTRY_FILE.format(self.index), self.entry())

    def entry(self) -> dict:
        return {"index": self.index, "count": self.count, "pid": os.getpid(),
                "cores": list(self.cores) if self.cores else None, "url": self.url}

    def start_meter(self, answered: Callable[[], int]) -> None:
        """This process's share of a core, sampled every second; a supervised server whose
        supervisor is gone stops itself (SIGTERM: the server's own shutdown)."""
        self.meter = CpuMeter(answered)
        Sampling(self.meter, also=self._orphaned if self.supervised else lambda: None)

    def _orphaned(self) -> None:
        if os.getppid() != self._parent:
            log.error("packrat front end %d: its supervisor (pid %d) is gone: stopping", self.index, self._parent)
            os.kill(os.getpid(), signal.SIGTERM)

    def describe(self) -> dict:
        """Its entry and its share of a core (CpuMeter.shares)."""
        return {**self.entry(), **(self.meter.shares() if self.meter else {})}

    def siblings(self) -> list[dict]:
        """The other servers' entries (those that wrote one)."""
        if self.directory is None or self.count == 1:
            return []
        found = [read_json(self.directory / ENTRY_FILE.format(i)) for i in range(self.count) if i != self.index]
        return [entry for entry in found if entry]

    async def gather(self, path: str) -> list[tuple[dict, bytes | None]]:
        """Each sibling's answer to GET `path` on its own address (None where it did not answer)."""
        siblings = self.siblings()
        answers = await asyncio.gather(*(asyncio.to_thread(fetch, f"{entry['url']}{path}") for entry in siblings))
        return list(zip(siblings, answers))


def reach(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def fetch(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            return response.read()
    except (urllib.error.URLError, OSError):
        return None


# ---- every front end's view ----------------------------------------------------------------------------

def with_front_ends(local: dict[str, dict], here: dict, others: Sequence[tuple[dict, bytes | None]]) -> dict:
    """Each model's status in this server (`local`, by name), with "front_end" (`here`: this server's
    place and share of a core) and, where there are several, "front_ends": that model's status in
    every server, in index order, each with its own "front_end"; one that did not answer is its entry
    with "unreachable": true."""
    statuses = {name: {**status, "front_end": here} for name, status in local.items()}
    if not others:
        return statuses
    theirs = [(entry, json.loads(body) if body else None) for entry, body in others]
    for name, status in statuses.items():
        every = [(here["index"], dict(status))]  # a copy: the status holds the list
        for entry, answer in theirs:
            found = (answer or {}).get(name)
            every.append((entry["index"], found if found else {"front_end": {**entry, "unreachable": True}}))
        status["front_ends"] = [s for _, s in sorted(every, key=lambda pair: pair[0])]
    return statuses


def merged_metrics(pages: Sequence[tuple[int, bytes | str | None]]) -> bytes:
    """Prometheus pages of several servers as one: every sample labelled front_end="INDEX", the samples
    of one metric together under its one HELP and TYPE."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    merged: dict[str, Metric] = {}
    for index, page in pages:
        if page is None:
            continue
        text = page.decode() if isinstance(page, bytes) else page
        for family in text_string_to_metric_families(text):
            metric = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                           family.unit))
            metric.samples += [s._replace(labels={**s.labels, "front_end": str(index)}) for s in family.samples]

    class Pages:
        def collect(self):
            return list(merged.values())

    registry = CollectorRegistry()
    registry.register(Pages())
    return generate_latest(registry)


# ---- the supervisor ----------------------------------------------------------------------------------

def listener(host: str, port: int, backlog: int) -> socket.socket:
    """The REST port, bound once (SO_REUSEADDR only: no other process may bind it beside), inheritable."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=backlog)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    """The servers of `blocks` (one per block of cores), started with `argv` and their place, their
    REST socket inherited; restarted when one exits, until stop()."""

    def __init__(self, argv: Sequence[str], blocks: Sequence[tuple[int, ...]], rest_fd: int, directory: Path):
        self.argv, self.blocks, self.rest_fd, self.directory = list(argv), list(blocks), rest_fd, directory
        self.cpus = [logical_cpus(block) for block in self.blocks]  # each block's cores with their SMT siblings
        self.processes: list[subprocess.Popen | None] = [None] * len(blocks)
        self.restart_at = [0.0] * len(blocks)
        self.started_at = [0.0] * len(blocks)
        self.failures = [0] * len(blocks)  # exits in a row, each after less than RESTART_S[1] of serving
        self.stopping: float | None = None

    def command(self, index: int) -> list[str]:
        """The server's command: the supervisor's arguments, then its place (argparse keeps the last
        of a repeated option)."""
        cores = ",".join(map(str, self.cpus[index]))
        return [sys.executable, "-m", "packrat.frontends.kserve_server", *self.argv, "--front-ends", "1",
                "--cores", cores, "--front-end", f"{index}/{len(self.blocks)}", "--front-end-dir",
                str(self.directory), "--rest-fd", str(self.rest_fd)]

    def start(self, index: int) -> None:
        process = subprocess.Popen(self.command(index), pass_fds=(self.rest_fd,), stdin=subprocess.DEVNULL)
        try:  # at once, before its imports start threads; the server pins every thread of its own again
            os.sched_setaffinity(process.pid, self.cpus[index])
        except OSError:
            pass
        self.processes[index], self.started_at[index] = process, time.monotonic()
        log.info("packrat front end %d started: pid %d, cores %s", index, process.pid, list(self.blocks[index]))

    def stop(self, *_) -> None:
        """Every server asked to stop (SIGTERM); the run ends once all have."""
        if self.stopping is None:
            self.stopping = time.monotonic()
        for process in self.processes:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)

    def run(self, period_s: float = 0.2) -> None:
        for index in range(len(self.blocks)):
            self.start(index)
        while True:
            if self.stopping is not None:
                if all(p is None or p.poll() is not None for p in self.processes):
                    return
                if time.monotonic() - self.stopping > STOP_S:
                    for process in self.processes:
                        if process is not None and process.poll() is None:
                            process.kill()
            else:
                self.look()
            time.sleep(period_s)

    def look(self) -> None:
        """Start again a server that exited, after its back-off."""
        now = time.monotonic()
        for index, process in enumerate(self.processes):
            if process is None or process.poll() is None:
                continue
            if not self.restart_at[index]:
                served_s = now - self.started_at[index]
                self.failures[index] = 1 if served_s > RESTART_S[1] else self.failures[index] + 1
                wait = min(RESTART_S[0] * 2 ** (self.failures[index] - 1), RESTART_S[1])
                self.restart_at[index] = now + wait
                log.error("packrat front end %d (pid %d) exited with %s: starting it again in %.0f s", index,
                          process.pid, process.returncode, wait)
            elif now >= self.restart_at[index]:
                self.restart_at[index] = 0.0
                self.start(index)


def supervise(argv: Sequence[str], choice: FrontEnds, host: str, port: int, backlog: int,
              directory: Path | None, budget=None) -> int:
    """Serve through choice.count servers on blocks of the budget's cores, until SIGTERM or SIGINT."""
    budget = budget or cpu_budget()
    blocks = split_cores(budget.topology.cores, choice.count)
    sock = listener(host, port, backlog)
    own_directory = directory is None
    directory = Path(tempfile.mkdtemp(prefix="packrat-front-ends-")) if own_directory else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / CHOICE_FILE, {**choice.to_json(), "pid": os.getpid(), "blocks": [list(b) for b in blocks]})
    log.info("packrat front ends: %d (%s); cores %s", choice.count, choice.why, " | ".join(map(str, blocks)))
    supervisor = Supervisor(argv, blocks, sock.fileno(), directory)
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    try:
        supervisor.run()
    finally:
        sock.close()
        if own_directory:
            for path in directory.iterdir():
                path.unlink(missing_ok=True)
            directory.rmdir()
    return 0


def record_choice(directory: Path | None, choice: FrontEnds, cores) -> None:
    """A lone server's choice, in its log and in the front-end directory, as a supervisor says its own."""
    log.info("packrat front ends: %d (%s)", choice.count, choice.why)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        write_json(directory / CHOICE_FILE, {**choice.to_json(), "pid": os.getpid(),
                                             "blocks": [list(cores)] if cores else None})
