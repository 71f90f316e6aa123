"""The packrat TorchServe handler: adapts TorchServe's batches to an instance pool.

initialize() reads the archive's packrat settings and profile, plans for the batch
size TorchServe was given and the cores this worker may use, and starts the pool.
handle() decodes each request (a bad one gets its own 4xx), runs the good ones as one
batch across the pool, and returns one response per request in order.
"""

from __future__ import annotations

import torch
from ts.torch_handler.base_handler import BaseHandler

from handlers import common
from packrat import codec
from packrat.planner import serving_plan
from packrat.pool import InstancePool
from packrat.profile import load
from packrat.topology import detect


class PackratHandler(BaseHandler):
    def initialize(self, context):
        properties = context.system_properties
        section = common.settings(context)
        model_dir = properties["model_dir"]
        model, self.spec = common.model_config(section, model_dir)
        self.input = codec.InputSpec(tuple(self.spec.input_shape), self.spec.input_dtype)
        batch = int(properties.get("batch_size") or 1)
        profile = load(f"{model_dir}/{section['profile']}")
        self.plan, fallback = serving_plan(profile.items(), detect().num_cores, batch, detect(),
                                           section.get("plan", "auto"))
        if fallback:
            common.log.warning(fallback)
        common.log.info("packrat plan for T=%d, B=%d: %s", self.plan.threads, self.plan.batch, self.plan.describe())
        self.pool = InstancePool.from_plan(model, self.plan)
        self.initialized = True

    def handle(self, data, context):
        decoded = common.decode_batch(data, self.input, context)
        good = [item for item in decoded if isinstance(item, torch.Tensor)]
        outputs = self.pool.run(torch.stack(good)) if good else None
        return common.respond(decoded, outputs, self.spec.task, context)
