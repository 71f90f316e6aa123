"""The packrat TorchServe handler: adapts TorchServe's requests to an instance pool.

initialize() reads the archive's packrat settings and profile, plans for the batch size
TorchServe was given and the cores this worker may use, and starts the pool under a controller
that re-plans when the load changes (`reconfigure: false` in the archive turns that off).
handle() only moves bytes: each request's body goes to the pool as it is, and its answer
(decoded, run and encoded inside an instance) comes back with its own status.

The archive runs this worker in TorchServe's asynchronous mode (`asyncCommunication: true`):
TorchServe hands over each batch as soon as it forms, without waiting for the previous one to
be answered, and handle() returns a coroutine, so several batches are in the pool at once and
the pool's dispatcher keeps every instance busy (see packrat/pool.py). In TorchServe's ordinary
mode handle() simply blocks until its batch is answered. The management API's
`GET /models/NAME?customized=true` returns the controller's status (plan, pool health,
reconfigurations).
"""

from __future__ import annotations

import asyncio

from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.base_handler import BaseHandler

from handlers import common
from packrat.controller import Controller
from packrat.estimator import BatchSizeEstimator, EstimatorSettings
from packrat.planner import serving_plan
from packrat.pool import InstancePool, configs_for
from packrat.profile import load
from packrat.topology import detect


class PackratHandler(BaseHandler):
    def initialize(self, context):
        properties = context.system_properties
        section = common.settings(context)
        model_dir = properties["model_dir"]
        model, spec = common.model_config(section, model_dir)
        codec = common.codec_config(section, spec, context.model_name, model_dir)
        self.max_batch = int(properties.get("batch_size") or 1)
        items, topology, mode = load(f"{model_dir}/{section['profile']}").items(), detect(), section.get("plan", "auto")

        def plan_for(batch: int):
            plan, fallback = serving_plan(items, topology.num_cores, batch, topology, mode)
            if fallback:
                common.log.warning(fallback)
            return plan

        start_batch = min(int(section.get("plan_batch") or self.max_batch), self.max_batch)
        plan = plan_for(start_batch)
        common.log.info("packrat plan for T=%d, B=%d: %s", plan.threads, plan.batch, plan.describe())
        self.pool = InstancePool.from_plan(model, plan, capacity=self.max_batch, codec=codec)
        estimator = BatchSizeEstimator(start_batch, self.max_batch,
                                       EstimatorSettings(**section.get("estimator", {})))
        self.controller = Controller(self.pool, plan, plan_for, lambda p: configs_for(p, self.max_batch), estimator)
        self.reconfigure = bool(section.get("reconfigure", True))
        self._reported = 0
        self.initialized = True

    @property
    def plan(self):
        return self.controller.plan

    def handle(self, data, context):
        if _describing(context):
            return [self.controller.status()]
        submit = self.controller.submit if self.reconfigure else self.pool.submit
        futures = [submit(common.to_request(row, context, i)) for i, row in enumerate(data)]
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # TorchServe's ordinary worker: answer this batch, then the next
            return self._respond([future.result() for future in futures], context)
        return self._gather(futures, context)  # asynchronous worker: it awaits this

    async def _gather(self, futures, context):
        return self._respond(await asyncio.gather(*map(asyncio.wrap_future, futures)), context)

    def _respond(self, answers, context) -> list[bytes]:
        self._report_metrics(context)
        return common.respond(answers, context)

    def describe_handle(self):
        return self.controller.status()

    def _report_metrics(self, context) -> None:
        """Pool health on every batch; one record per reconfiguration finished since the last."""
        if context.metrics is None:
            return
        health = self.pool.health()
        context.metrics.add_metric("PackratInstancesReady", health.ready, "count", metric_type=MetricTypes.GAUGE)
        context.metrics.add_metric("PackratRefusedRequests", health.refused, "count", metric_type=MetricTypes.GAUGE)
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


def _describing(context) -> bool:
    """A management API describe (`?customized=true`) rather than predictions."""
    try:
        return context.get_request_header(0, "describe") == "True"
    except (AttributeError, IndexError, KeyError, TypeError):
        return False
