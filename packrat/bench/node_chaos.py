"""The node under faults (issue 33): several packrat models in one TorchServe, each under
closed-loop locust load, while faults strike one at a time (benchmarks/node_chaos.py runs it).

Faults (FAULTS), each given a window of its own:
  owner-kill     SIGKILL of the worker holding the node's lease
  owner-stop     SIGSTOP of that worker for `stop_s`, then SIGCONT
  instance-stop  SIGSTOP of a pool instance while it holds a core lock, SIGCONT after `stop_s`
  re-register    the target model unregistered, then registered again
  move-slow      every other model's moves made to wait `slow_s` (member.NodeMember._injected)
                 while the target leaves and comes back
  move-fail      the same with the other models' moves failing for `fail_s`

Watched every POLL_S: whether the node is whole, how long a move was under way, the lease's
holder; per model and fault the requests sent, failed and their p99."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from packrat.bench.faults import pool_instances
from packrat.bench.harness import Periodic, wait_until
from packrat.bench.users import percentile
from packrat.serving.node import read_state
from packrat.serving.node.files import Lease, read_json, write_json
from packrat.serving.pool.core_locks import holders

FAULTS = ("owner-kill", "owner-stop", "instance-stop", "re-register", "move-slow", "move-fail")
POLL_S = 0.25
SETTLE_S = 120.0
AFTER_RETURN_S = 5.0  # an injected move fault lasts at least this long after the target is back


# ---- the node's state, read from its directory (pure parts first) -------------------------------

def whole(members: list[dict]) -> bool:
    """Every member has cores (as its heartbeat says), two members' meeting only where both take turns."""
    if not members or any(not m.get("share") for m in members):
        return False
    return all(not (set(a["share"][0]) & set(b["share"][0])) or (a["share"][1] and b["share"][1])
               for a, b in itertools.combinations(members, 2))


def in_motion(state: dict | None, members: list[dict]) -> bool:
    """A move under way: a step after this one, or a member that has not applied this one."""
    if not state or not state.get("steps"):
        return False
    now = [state["generation"], state["step"]]
    return state["step"] + 1 < len(state["steps"]) or any(m.get("applied") != now for m in members)


def moves_since(state: dict | None, started: float) -> str:
    """The node's moves since `started` in words: how many, failed, the slowest, the first failure's reason."""
    moves = [m for m in (state or {}).get("moves", []) if m["started_at"] >= started]
    failed = [m for m in moves if m.get("failed")]
    slowest = max((m["seconds"] for m in moves if m.get("seconds") is not None), default=None)
    return (f"{len(moves)} move(s) of the node, {len(failed)} failed"
            + (f", the slowest {slowest:.1f} s" if slowest is not None else "")
            + (f" ({failed[0]['failed'][:120]})" if failed else ""))


def window_figures(records: list, start: float, end: float) -> dict:
    """Requests sent in [start, end): how many, how many failed (by reason) and their p99 (ms)."""
    sent = [r for r in records if start <= r.start < end]
    failed = [r for r in sent if r.failed]
    return {"sent": len(sent), "failed": len(failed), "p99_ms": percentile((r.response_ms for r in sent if not r.failed), 0.99),
            "reasons": dict(Counter((r.reason or str(r.status))[:80] for r in failed))}


class NodeDir:
    """The node as its directory shows it."""

    def __init__(self, root: Path):
        self.root = root

    def members(self) -> list[dict]:
        """The members whose worker lives."""
        return [m for m in (read_json(p) for p in (self.root / "members").glob("*.json"))
                if m and psutil.pid_exists(m["pid"])]

    def whole(self) -> bool:
        return whole(self.members())

    def in_motion(self) -> bool:
        return in_motion(read_state(self.root), self.members())

    def settle(self, timeout_s: float) -> float:
        """Wait until the node is whole (at most `timeout_s`); the seconds waited."""
        started = time.monotonic()
        wait_until(self.whole, timeout_s, POLL_S)
        return time.monotonic() - started

    def lease(self) -> dict:
        epoch, path = Lease(self.root, "observer").newest()
        return {"epoch": epoch, **(read_json(path) if path else {})}

    def worker(self, model: str) -> int | None:
        return next((m["pid"] for m in self.members() if m["model"] == model and psutil.pid_exists(m["pid"])), None)

    def model_of(self, pid: int) -> str | None:
        return next((m["model"] for m in self.members() if m["pid"] == pid), None)


def signal_quietly(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


# ---- one fault ----------------------------------------------------------------------------------

@dataclass
class Fault:
    kind: str
    started: float  # unix time
    target: str = ""
    what: str = ""  # what was done, in words
    ended: float | None = None  # unix time the injected condition ended (the last kill, SIGCONT, the register)
    settled_before_s: float = 0.0  # how long the node took to be whole before the fault
    samples: list = field(default_factory=list)  # (unix time, whole, lease epoch, a move under way)
    status: dict = field(default_factory=dict)  # "during" / "after": `packrat status` text

    def figures(self) -> dict:
        broken = [t for t, is_whole, *_ in self.samples if not is_whole]
        last_broken = max(broken, default=None)
        epochs = sorted({epoch for _, _, epoch, _ in self.samples})
        return {"kind": self.kind, "target": self.target, "what": self.what, "settled_before_s": self.settled_before_s,
                "not_whole_s": round(len(broken) * POLL_S, 2),
                "whole_again_s": round(last_broken + POLL_S - self.started, 2) if last_broken else 0.0,
                "whole_after_fault_ended_s": round(max(0.0, last_broken + POLL_S - self.ended), 2)
                if last_broken and self.ended else 0.0,
                "moving_s": round(sum(moving for *_, moving in self.samples) * POLL_S, 2),
                "lease_epochs": epochs, "whole_at_end": bool(self.samples and self.samples[-1][1])}


class Chaos:
    """The faults, struck at one TorchServe `server` (model API on) of `mars` {model: archive} and `node`."""

    def __init__(self, server, mars: dict[str, Path], node: NodeDir, *, stop_s: float = 30.0, slow_s: float = 20.0,
                 fail_s: float = 10.0, window_s: float = 45.0, log=print):
        self.server, self.mars, self.node = server, mars, node
        self.stop_s, self.slow_s, self.fail_s, self.window_s, self.log = stop_s, slow_s, fail_s, window_s, log
        self.live = set(mars)
        self.notes: list[str] = []  # what went otherwise than asked, in words

    def status(self) -> str:
        run = subprocess.run([sys.executable, "-m", "packrat.cli", "status", "--run-dir", str(self.server.run_dir)],
                             capture_output=True, text=True, timeout=60)
        return run.stdout or run.stderr

    def strike(self, kind: str, target: str) -> Fault:
        """One fault, watched to the end of its window."""
        settled = self.node.settle(SETTLE_S)
        fault = Fault(kind, time.time(), target, settled_before_s=round(settled, 2))
        self.notes = []
        watch = lambda: fault.samples.append(  # noqa: E731
            (time.time(), self.node.whole(), self.node.lease().get("epoch"), self.node.in_motion()))
        with Periodic(POLL_S, "node-watch", watch):
            try:
                getattr(self, kind.replace("-", "_"))(fault)
            finally:
                fault.ended = fault.ended or time.time()
                fault.what += "".join(f" ({note})" for note in self.notes)
                fault.status["during"] = fault.status.get("during") or self.status()
                time.sleep(max(0.0, fault.started + self.window_s - time.time()))
        fault.status["after"] = self.status()
        self.log(f"   {kind}: {fault.what}; {fault.figures()}")
        return fault

    # ---- the faults ---------------------------------------------------------------------------

    def owner_kill(self, fault: Fault) -> None:
        pid = self.node.lease()["pid"]
        fault.target = self.node.model_of(pid) or "?"
        signal_quietly(pid, signal.SIGKILL)
        fault.what = f"SIGKILL of the owner's worker (pid {pid}, {fault.target})"

    def owner_stop(self, fault: Fault) -> None:
        pid = self.node.lease()["pid"]
        fault.target = self.node.model_of(pid) or "?"
        signal_quietly(pid, signal.SIGSTOP)
        fault.what = f"SIGSTOP of the owner's worker (pid {pid}, {fault.target}) for {self.stop_s:g} s"
        try:
            time.sleep(self.stop_s / 2)
            fault.status["during"] = self.status()
            time.sleep(self.stop_s / 2)
        finally:
            signal_quietly(pid, signal.SIGCONT)

    def instance_stop(self, fault: Fault) -> None:
        instances = {p.pid: model for model in self.live if (w := self.node.worker(model))
                     for p in pool_instances(w)}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            held = set(holders(self.node.root / "cores").values()) & set(instances)
            if held:
                pid = held.pop()
                fault.target = instances[pid]
                signal_quietly(pid, signal.SIGSTOP)
                fault.what = f"SIGSTOP of {fault.target}'s instance {pid} while it held a core lock"
                time.sleep(self.stop_s / 2)
                fault.status["during"] = self.status()
                time.sleep(self.stop_s / 2)
                signal_quietly(pid, signal.SIGCONT)  # unless its watchdog killed it
                return
            time.sleep(0.005)
        fault.what = "no instance held a core lock in 20 s (no model took turns): not struck"

    def re_register(self, fault: Fault) -> None:
        self._leave_and_return(fault.target)
        fault.what = f"{fault.target} unregistered, and registered again 5 s later"

    def move_slow(self, fault: Fault) -> None:
        self._moves_struck(fault, {"delay_s": self.slow_s}, self.slow_s, f"wait {self.slow_s:g} s")

    def move_fail(self, fault: Fault) -> None:
        self._moves_struck(fault, {"fail": "a chaos run's move-fail"}, self.fail_s, f"fail for {self.fail_s:g} s")

    def _moves_struck(self, fault: Fault, injected: dict, window_s: float, how: str) -> None:
        """The other models' moves struck by `injected` for `window_s` while the target leaves and returns."""
        others = self._inject(fault.target, injected)
        self._leave_and_return(fault.target)
        time.sleep(max(AFTER_RETURN_S, window_s - (time.time() - fault.started)))
        self._clear_injected()
        fault.what = (f"moves of {', '.join(others)} made to {how} while {fault.target} left and came back; "
                      f"{moves_since(read_state(self.node.root), fault.started)}")

    def _leave_and_return(self, target: str) -> None:
        """The target unregistered and registered again 5 s later: the others' cores change on one of the two
        (the plan says which), so an injected fault strikes."""
        from packrat.deploy import torchserve

        if target in self.live:
            self._unregister(target)
            time.sleep(5)
        torchserve.register(self.server, self.mars[target], target)
        self.live.add(target)

    def _inject(self, target: str, fault: dict) -> list[str]:
        """The injected fault for every live model but `target`; their names."""
        folder = self.node.root / "faults"
        folder.mkdir(exist_ok=True)
        others = sorted(self.live - {target})
        for model in others:
            write_json(folder / f"move-{model}.json", fault)
        return others

    def _clear_injected(self) -> None:
        for path in (self.node.root / "faults").glob("move-*.json"):
            path.unlink(missing_ok=True)

    def _unregister(self, model: str) -> None:
        """DELETE /models/MODEL; TorchServe 0.12 may answer 500 under load (a ConcurrentModificationException)
        though the model goes: then wait until it has, and say so."""
        import urllib.error

        from packrat.deploy import torchserve

        self.live.discard(model)
        try:
            torchserve.unregister(self.server, model)
        except urllib.error.HTTPError as exc:
            self.notes.append(f"unregistering {model}: TorchServe answered {exc.code}")
            wait_until(lambda: not torchserve.worker_status(self.server, model), 60, POLL_S)
            self.server.models = tuple(m for m in self.server.models if m != model)
            self.server.save()


def start_server(models: list[str], out: Path, users_batch: int):
    """TorchServe with a packrat archive per model (model API on): (server, {model: archive})."""
    from packrat.bench.servers import bert_tokenizer, torchserve_of, zoo_archives

    mars = dict(zip(models, zoo_archives(models, out / "model_store", users_batch, tokenizer=bert_tokenizer(models, out),
                                         max_batch_delay_ms=30)))
    return torchserve_of(out / "run", models, list(mars.values()), model_api=True), mars


def load(server, models: list[str], users: int, seconds: float, out: Path) -> dict:
    """Locust per model for `seconds`, in threads: {model: request records} once they end."""
    from packrat.bench.users import logged_load
    from packrat.codec.payloads import build_payload

    records: dict = {}

    def one(model: str) -> None:
        records[model] = logged_load(server.inference_url, model, users, seconds, out / model,
                                     out / f"requests-{model}.log", payload=build_payload(model),
                                     token=server.key("inference"), timeout_s=120)

    threads = [threading.Thread(target=one, args=(m,), daemon=True) for m in models]
    for thread in threads:
        thread.start()
    return {"threads": threads, "records": records}


def summary(faults: list[Fault], records: dict[str, list]) -> list[dict]:
    """A row per fault: its figures and each model's requests in its window."""
    rows = []
    for fault in faults:
        end = fault.started + max(POLL_S, (fault.samples[-1][0] - fault.started) if fault.samples else POLL_S)
        rows.append({**fault.figures(), "models": {m: window_figures(r, fault.started, end) for m, r in records.items()},
                     "status": fault.status})
    return rows

