"""The packrat TorchServe handler: adapts TorchServe's requests to packrat's engine.

initialize() builds the Engine (packrat/serving/engine.py) from the archive's packrat settings: the CPU
budget of this worker, the archive's profile for this machine, the plan for the batch size
TorchServe was given, and the pool under a controller that re-plans when the load changes
(`reconfigure: false` in the archive turns that off). The Ray Serve front end wraps the same engine.
handle() only moves bytes: each request's body goes to the pool as it is, and its answer
(decoded, run and encoded inside an instance) comes back with its own status.

TorchServe runs this worker in its ordinary mode: it gathers up to the archive's batch size
within maxBatchDelay, hands the batch over, and sends the next one once this one is answered.
Admission: TorchServe queues requests (up to the archive's jobQueueSize, which `packrat archive`
sizes from the plan's predicted batch time and the deadline) and answers 503 beyond that, before
this worker sees them. A request reaching handle() may have waited there: UpstreamWait bounds how
long from the batches seen before (counted from when TorchServe sent each: its Python side reads a
batch and decodes its JSON bodies before handle(), note_batch_sends) and, under `packrat serve`, from
looks at how many requests TorchServe's queue holds (its management API, 10 times a second); the
pool refuses it at once (503, with Retry-After) when
that wait and its batch's predicted time no longer fit its deadline, before its body is touched.
handle() submits the batch's requests to the pool together (none leaves before the last is in:
the instances start at once in this mode, gather 0 ms), its dispatcher splits them among the
instances, and handle() returns their answers in order. Each call is one observation of the load for the
controller: the batch plus whatever the pool still holds. (Not TorchServe's asynchronous mode: its
Java side loses track of requests under load and strands them; BENCHMARKS.md, issue 16.)
The management API's `GET /models/NAME?customized=true` returns the controller's status (plan,
pool health, reconfigurations).

Recovery (the archive's `request_timeout_s`, `max_queue`, `batch_timeout_s`, `hang_factor`,
`hang_floor_s`) is the pool's: see packrat/serving/pool/supervisor.py. Where a stuck thread instance
leaves the engine no cores, this worker process exits (restart_worker): TorchServe starts another,
whose engine plans on every core again. Under `packrat serve` the handler also
follows `packrat reconfigure` (a control file it polls).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from concurrent.futures import Future

from ts.metrics.metric_type_enum import MetricTypes

# TorchServe's BaseHandler imports openvino.torch when it is installed, for torch.compile backends this
# handler never uses (the instances run the model, each in a process of its own that imports what its
# runtime needs): 2-3 s of every worker's start on 2 cores. It is marked absent for that import alone,
# with BaseHandler's warning that OpenVINO is then not enabled (the instances' OpenVINO runtime is).
_HIDDEN, _base_log = "openvino.torch", logging.getLogger("ts.torch_handler.base_handler")
_hide, _level = _HIDDEN not in sys.modules, _base_log.level
if _hide:
    sys.modules[_HIDDEN] = None
    _base_log.setLevel(logging.ERROR)
try:
    from ts.torch_handler.base_handler import BaseHandler
finally:
    if _hide:
        _base_log.setLevel(_level)
        if sys.modules.get(_HIDDEN, 0) is None:
            del sys.modules[_HIDDEN]

from packrat.errors import first_line
from packrat.handlers import common
from packrat.frontends.torchserve_control import (follow_reconfigure_requests, note_batch_sends,
                                                  remember_queue_pace, watch_torchserve_queue)
from packrat.serving.engine import Engine
from packrat.serving.pool.admission import UpstreamWait
from packrat.serving.pool.api import Answer
from packrat.serving.pool.child import exit_with_parent
from packrat.settings import (CONTROL_DIR_ENV, MAX_QUEUE, REQUEST_TIMEOUT_S, SERVED_DIR_ENV, TS_KEY_FILE_ENV,
                              TS_MANAGEMENT_ENV)

METRICS_PERIOD_S = 1.0
RESTART_EXIT = 75  # EX_TEMPFAIL: the worker exits to be started again (restart_worker)
RESTART_GRACE_S = 1.0  # the batch in hand gets its 503s out before the worker exits
PACE_STEP = 0.1  # the pace served is remembered again once it moved by this fraction
TORCHSERVE_QUEUE = 100  # TorchServe's job_queue_size, for an archive that does not set jobQueueSize


class PackratHandler(BaseHandler):
    def initialize(self, context):
        properties = context.system_properties
        settings = common.settings(context)
        control_dir = CONTROL_DIR_ENV.get()  # set by `packrat serve`
        self.max_batch = settings.max_batch  # the batch the plan is for: TorchServe's batch size
        self.engine = Engine(settings, properties["model_dir"], context.model_name, max_batch=self.max_batch,
                             asynchronous=False, restart=lambda reason: restart_worker(getattr(self, "engine", None),
                                                                                       reason))
        self.pool, self.controller = self.engine.pool, self.engine.controller
        exit_with_parent(self.engine.close)  # the pool goes when Java does, whatever keeps this worker
        if control_dir:
            follow_reconfigure_requests(self.controller, control_dir, context.model_name, self.max_batch)
        self._reported, self._reported_at = 0, -METRICS_PERIOD_S
        config = getattr(context, "model_yaml_config", None) or {}
        queue, delay_ms = config.get("jobQueueSize") or TORCHSERVE_QUEUE, config.get("maxBatchDelay") or 100
        self.upstream = UpstreamWait(int(queue), self.max_batch, float(delay_ms) / 1e3)
        self.deadline_s, self.max_queue = settings.request_timeout_s or REQUEST_TIMEOUT_S, settings.max_queue or MAX_QUEUE
        self._queue_told = False  # TorchServe's queue too long for the served pace: said once in the log
        self.served_name, self._remembered = context.model_name, None  # the pace last remembered for the next archive
        self._sent_at = None  # when TorchServe began sending the last message (note_batch_sends)
        if not note_batch_sends(self._noted):
            common.log.warning("packrat: not in TorchServe's worker loop: waits in its queue are bounded without "
                               "when it sent each batch")
        if TS_MANAGEMENT_ENV.get():  # set by `packrat serve`: looks at TorchServe's queue tighten the bound
            watch_torchserve_queue(self.upstream.seen, TS_MANAGEMENT_ENV.get(), TS_KEY_FILE_ENV.get(), context.model_name)
        self.initialized = True

    def _noted(self, at: float) -> None:
        self._sent_at = at

    @property
    def plan(self):
        return self.controller.plan

    def handle(self, data, context):
        """One answer per request, in order. Never raises: an exception would fail every request of
        the batch."""
        if _describing(context):
            return [self.describe_handle()]
        now = time.monotonic()
        received_at = now - self.upstream.arrived(now, len(data), self._sent_at)  # the earliest it may have reached TorchServe
        self.engine.arrive(len(data))
        try:
            answers = [future.result() for future in self._submit_all(data, context, received_at)]
        finally:
            self.upstream.answered(time.monotonic())
        return self._respond(answers, context)

    def _submit_all(self, data, context, received_at: float) -> list[Future]:
        """A future per row: the rows the pool would take, queued as one batch (they reach the
        instances whole, not the first alone); the others answered already."""
        futures: list = [None] * len(data)
        requests, indices = [], []
        for index, row in enumerate(data):
            answer = self._refused(row, context, index, received_at)
            if isinstance(answer, Answer):
                futures[index] = Future()
                futures[index].set_result(answer)
            else:
                requests.append(answer)
                indices.append(index)
        for index, future in zip(indices, self.engine.submit_all(requests) if requests else ()):
            futures[index] = future
        return futures

    def _refused(self, row, context, index: int, received_at: float):
        """The row's request, or the Answer refusing it: checked before its body is re-encoded or
        copied anywhere."""
        refused = self.engine.refusal(received_at)
        if refused is not None:
            return refused
        try:
            return common.to_request(row, context, index, received_at)
        except Exception as exc:  # a body TorchServe decoded into something we cannot re-encode: its own failure
            return Answer.error(400, f"undecodable request: {type(exc).__name__}: {first_line(exc)}")

    def _respond(self, answers, context) -> list[bytes]:
        try:
            self._report_metrics(context)
        except Exception as exc:  # metrics must never cost an answer
            common.log.warning("packrat metrics not reported: %s", exc)
        return common.respond(answers, context)

    def describe_handle(self):
        return {**self.engine.status(), "torchserve_queue": self.torchserve_queue()}

    def torchserve_queue(self) -> dict:
        """TorchServe's queue as the archive sized it, and what it should hold for its last request to
        be answered in time at the pace the worker is served (None before a full batch followed a
        full one). TorchServe fixes a model's queue when it registers it (no API changes it), so the
        archive is what can change: `packrat archive --max-queue N`."""
        cycle = self.upstream.cycle_s()
        return {"size": self.upstream.capacity, "fits_at_served_pace": self.upstream.fitting(self.deadline_s, self.max_queue),
                "served_cycle_ms": None if cycle is None else round(cycle * 1e3, 1)}

    def _follow_queue_pace(self) -> None:
        """The pace served remembered for the next archive of this model (which sizes TorchServe's
        queue by it) when it moved by PACE_STEP; a queue too long for it said once in the log."""
        cycle = self.upstream.cycle_s()
        if cycle is None:
            return
        if self._remembered is None or abs(cycle - self._remembered) > PACE_STEP * self._remembered:
            remember_queue_pace(SERVED_DIR_ENV.get(), self.served_name, self.max_batch, cycle)
            self._remembered = cycle
        self._tell_if_queue_too_long()

    def _tell_if_queue_too_long(self) -> None:
        fits = self.upstream.fitting(self.deadline_s, self.max_queue)
        if self._queue_told or fits is None or self.upstream.capacity <= 2 * fits:
            return
        self._queue_told = True
        common.log.warning("packrat: TorchServe's queue holds %d requests; at the pace served (a batch of %d every "
                           "%.0f ms) the %g s deadline fits %d: requests past that wait there and are refused after "
                           "their wait, not at once. The next archive of this model sizes it so; or rebuild now with --max-queue %d", self.upstream.capacity,
                           self.max_batch, self.upstream.cycle_s() * 1e3, self.deadline_s, fits, fits)

    def _report_metrics(self, context) -> None:
        """Pool health at most once a second (each metric is a line TorchServe's Java side reads and
        logs); one record per reconfiguration finished since the last."""
        now = time.monotonic()
        if context.metrics is None or now - self._reported_at < METRICS_PERIOD_S:
            return
        self._reported_at = now
        self._follow_queue_pace()
        health = self.pool.health()
        context.metrics.add_metric("PackratInstancesReady", health.ready, "count", metric_type=MetricTypes.GAUGE)
        context.metrics.add_metric("PackratRefusedRequests", health.refused, "count", metric_type=MetricTypes.GAUGE)
        if health.predicted_wait_ms is not None:
            context.metrics.add_metric("PackratPredictedWait", health.predicted_wait_ms, "ms",
                                       metric_type=MetricTypes.GAUGE)
        for name, value in (("PackratAdmittedRequests", health.admitted),
                            ("PackratWatchdogKills", health.watchdog_kills), ("PackratExpiredRequests", health.expired),
                            ("PackratRequeuedRequests", health.requeued), ("PackratRespawns", self.pool.respawns)):
            context.metrics.add_metric(name, value, "count", metric_type=MetricTypes.GAUGE)
        for cause, value in health.refusals.items():  # PackratRefusedLate, PackratRefusedQueueFull, ...
            name = "PackratRefused" + "".join(word.title() for word in cause.split("_"))
            context.metrics.add_metric(name, value, "count", metric_type=MetricTypes.GAUGE)
        records = self.controller.reconfigurations
        if len(records) == self._reported:
            return
        for record in records[self._reported:]:
            context.metrics.add_metric("PackratReconfigurationSeconds", round(record.seconds, 3), "s",
                                       metric_type=MetricTypes.GAUGE)
            context.metrics.add_counter("PackratReconfigurations", 1)
            if record.error:
                context.metrics.add_counter("PackratReconfigurationFailures", 1)
        plan = self.controller.plan
        context.metrics.add_metric("PackratPlanBatch", plan.batch, "count", metric_type=MetricTypes.GAUGE)
        context.metrics.add_metric("PackratPlanInstances", len(plan.instances), "count", metric_type=MetricTypes.GAUGE)
        self._reported = len(records)


def restart_worker(engine, reason: str, grace_s: float = RESTART_GRACE_S, exit=os._exit) -> None:
    """The engine has no cores left (stuck thread instances hold them, and only the end of this
    process ends them): after `grace_s`, its pool closed, this worker exits; TorchServe starts
    another in its place, as it does for any worker that dies."""
    common.log.error("packrat worker exits (code %d) for TorchServe to start another: %s", RESTART_EXIT, reason)
    time.sleep(grace_s)
    try:
        if engine is not None:
            engine.close()
    finally:
        exit(RESTART_EXIT)


def _describing(context) -> bool:
    """A management API describe (`?customized=true`) rather than predictions."""
    try:
        return context.get_request_header(0, "describe") == "True"
    except (AttributeError, IndexError, KeyError, TypeError):
        return False
