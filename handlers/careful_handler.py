"""The careful user's handler: what someone who knows their runtime writes instead of a serving
system. One worker; in it one session of the archive's `runtime` (ONNX Runtime's InferenceSession
or OpenVINO's compiled model with the runtime's defaults and a thread per core; torch in the
profile's graph mode with every core for inductor); a batch's requests decoded in parallel on a
pool of a thread per core, each straight into its row of one preallocated batch the session reads;
torch's intra-op threads at 1 wherever torch only decodes. The same decoding and answers as
packrat's instances (packrat.codec.batch), so a comparison measures only how the cores are used.

It takes the care packrat's instances take where a careful user would too: ONNX Runtime's threads
stop spinning after a run where decoders share their cores (packrat's own instances do so since
spinning on slowed decoding from 4.8 to 9.1 ms, BENCHMARKS.md, issue 41), and it warms up each
batch size of the halving ladder the pool's instances warm up (child.warm_up). Stopping is decided
by the rule packrat's instances follow rather than by timing both at start: the cost of spinning
falls on the decoders, which a start-up timing of the session alone would not see.

What still differs from a packrat instance of the same runtime (logged at start, what_differs):
one session on all the worker's cores rather than the plan's instances; nothing pinned; torch's
inter-op threads at torch's default (packrat's: 1); no pool around it (no watchdog, admission or
re-planning); under OpenVINO, its LATENCY hint's own streams and CPU pinning (packrat's: one stream,
its pinning off). ONNX Runtime's session defaults are packrat's settings but for its inter-op
threads, idle in a sequential session."""

from __future__ import annotations

import logging
import os

import torch
from ts.torch_handler.base_handler import BaseHandler

from packrat.codec.batch import Decoders, answer_batch, set_intra_op_threads
from packrat.codec.codec import Codec
from packrat.codec.rows import InputRows
from packrat.handlers import common
from packrat.models.runtimes import DEFAULT_RUNTIME, base_runtime, prepare_runtime, torch_threads
from packrat.models.zoo import prepare
from packrat.serving.engine import codec_config, model_config
from packrat.serving.pool.api import Answer
from packrat.serving.pool.child import warm_up

log = logging.getLogger(__name__)

# what differs from a packrat instance under every runtime, then under a runtime's own session
WHAT_DIFFERS = ("one session on all the worker's cores, not the plan's instances; nothing pinned (a packrat "
                "instance pins its process, or its thread and the session's threads one a core); torch's "
                "inter-op threads at torch's default (packrat's: 1); no pool around it (no watchdog, "
                "admission or re-planning)")
RUNTIME_DIFFERS = {"openvino": "OpenVINO's LATENCY hint with its own streams and CPU pinning (packrat's: one "
                               "stream, its pinning off)"}


def what_differs(runtime: str) -> str:
    """The line saying what still differs from a packrat instance running `runtime`."""
    own = RUNTIME_DIFFERS.get(base_runtime(runtime))
    return WHAT_DIFFERS + (f"; {own}" if own else "")


def started_line(runtime: str, cores: int, batch: int, full_ms: float, decoders: Decoders) -> str:
    """What the handler runs, as it says at start, and what still differs from packrat's instance."""
    return (f"careful handler: one {runtime} session of {cores} threads{_spinning(runtime, decoders)}, "
            f"batch {batch} (warm {full_ms:.1f} ms), {cores if decoders.parallel else 1} decoder(s); "
            f"unlike a packrat instance: {what_differs(runtime)}")


def _spinning(runtime: str, decoders: Decoders) -> str:
    if base_runtime(runtime) != "onnxruntime":
        return ""
    return ", its threads stopping after a run" if decoders.parallel else ", its threads spinning on after a run"


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
            self.model, examples = prepare_runtime(spec, runtime, batch, cores, model.compile_cache, plain=True,
                                                   stop_spinning=self.decoders.parallel)
        self.rows = InputRows.allocate(config, batch)
        with torch.inference_mode():
            full_ms = warm_up(self.model, examples, cores)  # each size of the ladder, as the pool's instances
        log.info(started_line(runtime, cores, batch, full_ms, self.decoders))
        self.initialized = True

    def handle(self, data, context):
        requests = [common.to_request(row, context, i) for i, row in enumerate(data)]
        bodies = [(r.body, r.content_type, r.header_length) for r in requests]
        answers = answer_batch(self.model, self.codec, bodies, self.decoders.mapper(len(bodies)), rows=self.rows)
        return common.respond([Answer(*a) for a in answers], context)
