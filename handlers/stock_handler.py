"""The baseline: a plain BaseHandler-style handler running the model in the worker process,
with TorchServe's own workers and threads. Same decoding and answers as the packrat handler
(packrat.codec.batch), so a comparison measures only how the cores are used. The archive's
`runtime` setting picks the engine (inductor in the profile's graph mode by default; OpenVINO or
ONNX Runtime with a thread per core), so stock can run what packrat's instances run."""

from __future__ import annotations

import os

import torch
from ts.torch_handler.base_handler import BaseHandler

from packrat.handlers import common
from packrat.codec.codec import Codec
from packrat.models.runtimes import DEFAULT_RUNTIME, prepare_runtime
from packrat.models.zoo import prepare
from packrat.serving.engine import codec_config, model_config
from packrat.codec.batch import answer_batch
from packrat.serving.pool.api import Answer


class StockHandler(BaseHandler):
    def initialize(self, context):
        settings = common.settings(context)
        model_dir = context.system_properties["model_dir"]
        model, spec = model_config(settings, model_dir)
        self.codec = Codec(codec_config(settings, spec, context.model_name, model_dir))
        batch = int(context.system_properties.get("batch_size") or 1)
        if settings.runtime in (None, DEFAULT_RUNTIME):
            self.model, examples, _ = prepare(spec, batch, graph_mode=model.graph_mode,
                                              compile_cache=model.compile_cache)
        else:  # as a user's handler would run it: the runtime's own threads, one per core it may use
            self.model, examples = prepare_runtime(spec, settings.runtime, batch, len(os.sched_getaffinity(0)),
                                                   model.compile_cache)
        with torch.inference_mode():
            self.model(*examples)  # warm-up, as the pool does
        self.initialized = True

    def handle(self, data, context):
        requests = [common.to_request(row, context, i) for i, row in enumerate(data)]
        answers = answer_batch(self.model, self.codec, [(r.body, r.content_type, r.header_length) for r in requests])
        return common.respond([Answer(*a) for a in answers], context)
