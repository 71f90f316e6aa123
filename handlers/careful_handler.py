"""The careful user's handler: what someone who knows their runtime writes instead of a serving
system. One worker; in it one session of the archive's `runtime` (ONNX Runtime's InferenceSession
or OpenVINO's compiled model with the runtime's defaults and a thread per core; torch in the
profile's graph mode with every core for inductor); a batch's requests decoded in parallel on a
pool of a thread per core, each straight into its row of one preallocated batch the session reads;
torch's intra-op threads at 1 wherever torch only decodes. The same decoding and answers as
packrat's instances (packrat.codec.batch), so a comparison measures only how the cores are used."""

from __future__ import annotations

import os

import torch
from ts.torch_handler.base_handler import BaseHandler

from packrat.codec.batch import Decoders, answer_batch, set_intra_op_threads
from packrat.codec.codec import Codec
from packrat.codec.rows import InputRows
from packrat.handlers import common
from packrat.models.runtimes import DEFAULT_RUNTIME, prepare_runtime, torch_threads
from packrat.models.zoo import prepare
from packrat.serving.engine import codec_config, model_config
from packrat.serving.pool.api import Answer


class CarefulHandler(BaseHandler):
    def initialize(self, context):
        settings = common.settings(context)
        model_dir = context.system_properties["model_dir"]
        model, spec = model_config(settings, model_dir)
        config = codec_config(settings, spec, context.model_name, model_dir)
        self.codec = Codec(config)
        batch = int(context.system_properties.get("batch_size") or 1)
        cores = len(os.sched_getaffinity(0))
        runtime = settings.runtime or DEFAULT_RUNTIME
        self.decoders = Decoders(cores if self.codec.input_kind == "image" else 1)  # before torch's count is set
        set_intra_op_threads(torch_threads(runtime, cores))
        if runtime == DEFAULT_RUNTIME:
            self.model, examples, _ = prepare(spec, batch, graph_mode=model.graph_mode,
                                              compile_cache=model.compile_cache)
        else:
            self.model, examples = prepare_runtime(spec, runtime, batch, cores, model.compile_cache, plain=True)
        self.rows = InputRows.allocate(config, batch)
        with torch.inference_mode():
            self.model(*examples)  # warm-up, as the pool does
        self.initialized = True

    def handle(self, data, context):
        requests = [common.to_request(row, context, i) for i, row in enumerate(data)]
        bodies = [(r.body, r.content_type, r.header_length) for r in requests]
        answers = answer_batch(self.model, self.codec, bodies, self.decoders.mapper(len(bodies)), rows=self.rows)
        return common.respond([Answer(*a) for a in answers], context)
