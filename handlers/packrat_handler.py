"""The packrat TorchServe handler: adapts TorchServe's batches to an instance pool.

initialize() reads the archive's packrat settings and profile, plans for the batch
size TorchServe was given and the cores this worker may use, and starts the pool under
a controller that re-plans when the batch sizes TorchServe hands over change
(`reconfigure: false` in the archive turns that off). handle() decodes each request (a
bad one gets its own 4xx), runs the good ones as one batch, and returns one response
per request in order. The management API's `GET /models/NAME?customized=true` returns
the controller's status (current plan, recent reconfigurations).
"""

from __future__ import annotations

import torch
from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.base_handler import BaseHandler

from handlers import common
from packrat import codec
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
        model, self.spec = common.model_config(section, model_dir)
        self.input = codec.InputSpec(tuple(self.spec.input_shape), self.spec.input_dtype)
        self.max_batch = int(properties.get("batch_size") or 1)
        self.reconfigure = bool(section.get("reconfigure", True))
        items, topology, mode = load(f"{model_dir}/{section['profile']}").items(), detect(), section.get("plan", "auto")

        def plan_for(batch: int):
            plan, fallback = serving_plan(items, topology.num_cores, batch, topology, mode)
            if fallback:
                common.log.warning(fallback)
            return plan

        start_batch = min(int(section.get("plan_batch") or self.max_batch), self.max_batch)
        plan = plan_for(start_batch)
        common.log.info("packrat plan for T=%d, B=%d: %s", plan.threads, plan.batch, plan.describe())
        pool = InstancePool.from_plan(model, plan, capacity=self.max_batch)
        estimator = BatchSizeEstimator(start_batch, self.max_batch,
                                       EstimatorSettings(**section.get("estimator", {})))
        self.controller = Controller(pool, plan, plan_for, lambda p: configs_for(p, self.max_batch), estimator)
        self.pool, self.context = pool, context
        self._reported = 0
        self.initialized = True

    @property
    def plan(self):
        return self.controller.plan

    def handle(self, data, context):
        self.context = context
        if self._is_describe():
            return [self.describe_handle()]
        decoded = common.decode_batch(data, self.input, context)
        good = [item for item in decoded if isinstance(item, torch.Tensor)]
        outputs = None
        if good:
            batch = torch.stack(good)
            outputs = self.controller.run(batch) if self.reconfigure else self.pool.run(batch)
        self._report_metrics(context)
        return common.respond(decoded, outputs, self.spec.task, context)

    def describe_handle(self):
        return self.controller.status()

    def _report_metrics(self, context) -> None:
        """Custom metrics for each reconfiguration finished since the last batch."""
        records = self.controller.reconfigurations
        if len(records) == self._reported or context.metrics is None:
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
