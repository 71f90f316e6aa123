"""What the pool's users hand it and get back: instance and model settings, requests, answers,
health, and the pool's error type. Plain data; no processes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from packrat.errors import error_body


@dataclass(frozen=True)
class InstanceConfig:
    threads: int
    batch: int  # planned sub-batch: the share of a full batch this instance runs
    cores: tuple[int, ...]
    capacity: int = 0  # most requests it takes at once when the queue is long; at least `batch`
    expected_ms: float | None = None  # the profile's L(threads, batch): the watchdog's yardstick
    runtime: str = "inductor"  # packrat.models.runtimes.RUNTIMES: the engine that runs this instance's model
    fallbacks: tuple[str, ...] = ()  # runtimes to run it with instead, in order, if `runtime` fails here
    # (inductor, the default, is always the last resort)

    @property
    def slots(self) -> int:
        return max(self.capacity, self.batch)


@dataclass(frozen=True)
class ModelConfig:
    model: str  # zoo name, TorchScript file or package.module:factory (packrat.models.zoo.resolve)
    input_shape: tuple[int, ...] | None = None
    graph_mode: str = "compile"  # packrat.models.modes.MODES
    compile_cache: str | None = None  # compiled packages shipped here are used first (an archive's directory)
    ios_cache: str | None = None  # where instances of the ios runtime keep their schedules (None: runtimes.IOS_CACHE)


@dataclass(frozen=True)
class Request:
    body: bytes | bytearray | memoryview  # any bytes-like body: the pool copies it once, into shared memory
    content_type: str | None = None
    header_length: int | str | None = None  # KServe v2 binary extension: Inference-Header-Content-Length, as sent
    received_at: float | None = None  # time.monotonic() when the front end received it (its deadline counts
    # from there: receiving, parsing, the GIL, TorchServe's queue); None: when the pool got it
    timeout_s: float | None = None  # the client's own deadline after received_at (gRPC's, Triton's `timeout`);
    # the server's request_timeout_s or this, whichever is tighter

    @classmethod
    def as_received(cls, body: bytes, content_type: str | None = None) -> "Request":
        """A request with its body in a buffer of its own, as a server hands it over (TorchServe's
        bytearray, packrat's front ends'): what benchmarks and served figures send, so that they
        take the path a served request takes (values not bound for a row read where they lie)."""
        return cls(bytearray(body), content_type)


class Answer(NamedTuple):
    """A request's answer. A tuple: one is made for every request, and a frozen dataclass costs
    several times as much to make."""
    status: int
    body: bytes  # JSON, or a binary KServe v2 answer (JSON header, then raw outputs)
    reason: str = ""  # one line, for errors
    content_type: str = "application/json"
    header_length: int | None = None  # binary KServe v2 answers: the response's Inference-Header-Content-Length
    retry_after_s: int | None = None  # refusals: when the pool predicts it would be taken (a Retry-After header)

    @classmethod
    def error(cls, status: int, reason: str, retry_after_s: int | None = None) -> "Answer":
        return cls(status, error_body(reason), reason, retry_after_s=retry_after_s)

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass
class Health:
    instances: int
    ready: int
    respawning: int
    respawn_failures: int  # failed respawn attempts since start
    unavailable: str | None  # why requests are being refused now, or None
    queued: int
    answered: int
    refused: int  # requests answered 503: none could be answered in time, the queue was full, no instance could run
    watchdog_kills: int = 0  # instances killed because a batch ran past its deadline
    expired: int = 0  # requests answered 504: not answered within the request timeout
    requeued: int = 0  # requests re-run after their instance died or hung
    stage_ms: dict[str, float] = field(default_factory=dict)  # mean ms per stage of the pool's hop over the
    # last sub-batches, and their "total" (packrat.serving.pool.stages); empty before the first
    sub_batches: int = 0  # sub-batches answered since the pool started
    requests_per_sub_batch: float = 0.0  # their mean size over the same last sub-batches
    fallbacks: list[str] = field(default_factory=list)  # instances running another runtime than planned, and why
    kinds: list[dict] = field(default_factory=list)  # each instance: index, kind (thread or process), runtime, cores
    abandoned: int = 0  # thread instances left stuck in a cancelled run since the start (supervisor.py)
    fenced: list[int] = field(default_factory=list)  # the cores those still stuck hold: left out of every plan
    admitted: int = 0  # requests taken in since the pool started
    refused_late: int = 0  # of the refused: predicted to be answered after their deadline (admission.py)
    predicted_wait_ms: float | None = None  # a request arriving now would be answered in this, as predicted
    served_ratio: float = 1.0  # how long the pool's sub-batches took over the plan's latency for them (admission.py)
    refusals: dict[str, int] = field(default_factory=dict)  # requests not admitted or not run, by cause
    # (admission.CAUSES: late, queue_full, expired_before, unavailable); each also in refused or expired


def configs_for(plan, capacity: int = 0, fallbacks=None) -> list[InstanceConfig]:
    """One instance per planned ⟨threads, batch, cores⟩ of a planner.Plan; `capacity` lets
    each take up to that many requests (e.g. TorchServe's batch size, when the plan is for less).
    `fallbacks`: (threads, batch) -> the point's other runtimes, fastest first (a profile's
    fallbacks()), for an instance whose runtime fails on this machine."""
    fallbacks = fallbacks or {}
    return [InstanceConfig(i.threads, i.batch, tuple(i.cores), capacity, i.latency_ms, i.runtime,
                           tuple(r for r in fallbacks.get((i.threads, i.batch), ()) if r != i.runtime))
            for i in plan.instances]
