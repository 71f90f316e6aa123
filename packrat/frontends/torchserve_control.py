"""Control files between `packrat` commands and a running packrat server (the TorchServe handler,
the KServe server): reconfiguration requests; and the TorchServe handler's looks at TorchServe's
queue for its model and at when TorchServe sends each batch (admission)."""

from __future__ import annotations

import json
import os
import select
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

CONTROL_DIR = "control"  # in the run dir: requests to the running handler, one JSON file per model
POLL_S = 0.5  # how often a server looks for a new request
QUEUE_LOOK_S = 0.1  # how often the TorchServe handler looks at TorchServe's queue: 10 small GETs a second
PACE_KEPT_S = 86400.0  # a remembered pace of TorchServe's queue sizes archives for a day, as corrections last


def control_file(control_dir: str | Path, model: str) -> Path:
    return Path(control_dir) / f"{model}.json"


def request_reconfigure(control_dir: str | Path, model: str, batch: int) -> Path:
    """Ask the running handler to switch to the plan for `batch` now: writes
    CONTROL_DIR/MODEL.json = {"batch", "requested_at"} atomically (a temporary file, then
    os.replace), which the handler polls (read_reconfigure_request). Returns the file."""
    if not _is_batch(batch):
        raise ValueError(f"the batch size to reconfigure for must be an integer >= 1, got {batch!r}")
    path = control_file(control_dir, model)
    _write_atomically(path, {"batch": batch, "requested_at": time.time()})
    return path


def _write_atomically(path: Path, content) -> None:
    """JSON into `path` through a temporary file and os.replace, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                     delete=False) as out:
        json.dump(content, out)
    os.replace(out.name, path)


def read_reconfigure_request(control_dir: str | Path, model: str) -> tuple[int, float] | None:
    """(batch, requested_at) of the model's reconfiguration request in `control_dir` (the
    handler's CONTROL_DIR_ENV); None when there is none or it is unreadable."""
    try:
        request = json.loads(control_file(control_dir, model).read_text())
        batch, requested_at = request["batch"], request["requested_at"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not _is_batch(batch) or isinstance(requested_at, bool) or not isinstance(requested_at, (int, float)):
        return None
    return batch, float(requested_at)


def _is_batch(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def follow_reconfigure_requests(controller, control_dir: str | Path, model: str, max_batch: int,
                                until: threading.Event | None = None) -> threading.Thread:
    """A daemon thread that switches `controller` to the plan a new request asks for (one newer
    than any there at the start), polling every POLL_S until `until` is set. A request made while
    a switch is under way is taken at the next poll."""

    stop = until or threading.Event()  # never set: followed for as long as the process lives

    def follow() -> None:
        seen = read_reconfigure_request(control_dir, model)
        seen_at = seen[1] if seen else 0.0
        while not stop.wait(POLL_S):
            wanted = read_reconfigure_request(control_dir, model)
            if wanted is None or wanted[1] <= seen_at:
                continue
            batch = min(max(1, wanted[0]), max_batch)
            if controller.request(batch, f"requested by packrat reconfigure (batch {wanted[0]})"):
                seen_at = wanted[1]

    thread = threading.Thread(target=follow, daemon=True, name=f"packrat-control-{model}")
    thread.start()
    return thread


def watch_torchserve_queue(seen, management_url: str, key_file: str | Path | None, model: str,
                           every_s: float = QUEUE_LOOK_S) -> threading.Thread:
    """A daemon thread calling seen(monotonic time, requests pending) every `every_s` with what
    TorchServe's management API says its queue for `model` holds (the describe call's
    jobQueueStatus, answered by Java alone). A look that fails is skipped."""
    def look() -> int:
        request = urllib.request.Request(f"{management_url}/models/{model}")
        if key_file:
            key = json.loads(Path(key_file).read_text())["management"]["key"]
            request.add_header("Authorization", f"Bearer {key}")
        with urllib.request.urlopen(request, timeout=2.0) as response:
            return int(json.loads(response.read())[0]["jobQueueStatus"]["pendingRequests"])

    def loop() -> None:
        while True:
            try:
                seen(time.monotonic(), look())
            except (OSError, ValueError, KeyError, IndexError, TypeError):
                pass  # TorchServe busy or restarting: the next look
            time.sleep(every_s)

    thread = threading.Thread(target=loop, daemon=True, name=f"packrat-queue-{model}")
    thread.start()
    return thread


def note_batch_sends(noted) -> bool:
    """Have this TorchServe worker call noted(time.monotonic()) as each message from TorchServe's
    Java side begins to arrive, before its Python side reads it and decodes its JSON bodies (the
    handler's clock starts only after that). TorchServe runs the worker as a script whose loop
    calls `retrieve_msg` by its global name; that name is wrapped. False where this process is no
    such worker (the wait bound then does without)."""
    worker = sys.modules.get("__main__")
    original = getattr(worker, "retrieve_msg", None)
    if original is None or not hasattr(worker, "TorchModelServiceWorker"):
        return False

    def retrieve_msg(conn):
        select.select([conn], [], [])  # until Java sends: a batch, a describe or a load
        noted(time.monotonic())
        return original(conn)

    worker.retrieve_msg = retrieve_msg
    return True


def _pace_file(served_dir: str | Path, model: str, batch: int) -> Path:
    return Path(served_dir) / f"torchserve-queue-{model}-b{batch}.json"


def remember_queue_pace(served_dir: str | Path, model: str, batch: int, cycle_s: float) -> None:
    """The pace the handler was served at (seconds from one full batch of `batch` to the next), for
    the next archive of `model` to size TorchServe's queue by (TorchServe fixes it at registration)."""
    _write_atomically(_pace_file(served_dir, model, batch), {"cycle_s": cycle_s, "at": time.time()})


def remembered_queue_pace(served_dir: str | Path, model: str, batch: int, now: float | None = None) -> float | None:
    """The pace remembered for `model` at `batch` within PACE_KEPT_S; None when there is none (or unreadable)."""
    try:
        remembered = json.loads(_pace_file(served_dir, model, batch).read_text())
        cycle_s, at = float(remembered["cycle_s"]), float(remembered["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    fresh = (time.time() if now is None else now) - at <= PACE_KEPT_S
    return cycle_s if fresh and cycle_s > 0 else None
