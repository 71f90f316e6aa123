"""A thread instance's decode and encode stages cost what their work costs, nothing more: at every
batch size from 1 to 64 and for narrow and wide outputs, each stays under a bound derived from the
rows and values it handles, as the pool's own stage timers measure it (pool.stages).

Issue 70 found an MLP's encode at B = 8 taking 7.3 ms (0.03 ms at B = 1) where torch's count in the
process was 2: a parallel region on the instance's thread, pinned to one core, spun out before its
OpenMP worker on that same core ran. The process's count is set to 2 here so that such a cost shows,
and the instance's thread is asked its own count (1), which shows the cause where the cost would not.

The model is a table of outputs in place of an ONNX Runtime session (the ONNX export belongs to the
integration tier): what is timed is the codec around it, on the thread instance's own thread. The
codec answers one output tensor per request, so there is no multi-output case."""

from __future__ import annotations

import os

import pytest
import torch

from packrat.codec.config import CodecConfig
from packrat.codec.forms import sample_request
from packrat.models import runtimes
from packrat.serving.pool import child
from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
from packrat.serving.pool.instance_pool import InstancePool

SLOTS = 64
BATCHES = (1, 2, 3, 8, 17, 64)
ROUNDS = 5  # the median of these: a loaded machine's stray slow round does not decide
INPUT = (16,)  # one sample's input: a raw body of 64 bytes
# The bound of a stage: FIXED_MS, plus PER_ROW_US and PER_VALUE_US per value for each row. Measured
# on a 2-core VM (idle): 0.02-0.06 ms a batch, 0.005 ms a classifier's row, 0.15 us a float of an
# embedding's JSON; the bound leaves 4 ms for scheduling on a loaded machine and 5x the work's time,
# and fails a 7 ms stage at any batch of a narrow output under 64 rows.
FIXED_MS, PER_ROW_US, PER_VALUE_US = 4.0, 25.0, 2.0
OUTPUTS = {  # case: (task, values per output row)
    "classifier logits": ("classification", 10),
    "wide classifier": ("classification", 1000),
    "wide embedding": ("embedding", 1024),
}


def bound_ms(rows: int, values_per_row: int) -> float:
    """The most a stage handling `rows` rows of `values_per_row` values each may take."""
    return FIXED_MS + rows * (PER_ROW_US + values_per_row * PER_VALUE_US) / 1e3


class TableOfOutputs:
    """A model answering each row with its row of a fixed table, as a new tensor (a runtime's
    outputs are fresh memory each run)."""

    def __init__(self, width: int):
        self.table = torch.randn(SLOTS, width, generator=torch.Generator().manual_seed(0))

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.table[:len(inputs)] + inputs[:, :1]


@pytest.fixture
def process_torch_threads():
    """torch's count in this process at 2 for the test (a benchmark's process, not the engine's 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def serving_table(monkeypatch, width: int) -> None:
    """Thread instances load TableOfOutputs(width) where they would load an ONNX Runtime session."""
    def load_runtime(spec, model, config, runtime, stop_spinning=True):
        return TableOfOutputs(width), (torch.zeros(config.batch, *INPUT),), runtime
    monkeypatch.setattr(runtimes, "ensure_artefact", lambda *args, **kwargs: None)
    monkeypatch.setattr(child, "load_runtime", load_runtime)


def stage_medians(pool: InstancePool, batch: int) -> dict[str, float]:
    """The pool's median ms of each stage over ROUNDS batches of `batch` raw requests."""
    requests = [Request(*sample_request(pool.codec.input_specs(), (torch.rand(INPUT),))) for _ in range(batch)]
    pool.infer(requests)  # a size's first batch may find caches cold
    pool.stages.clear()
    for _ in range(ROUNDS):
        assert all(answer.ok for answer in pool.infer(requests))
    return pool.stages.medians()


@pytest.mark.parametrize("case", OUTPUTS)
def test_a_thread_instances_codec_stages_grow_only_with_their_work(case, monkeypatch, process_torch_threads):
    task, width = OUTPUTS[case]
    serving_table(monkeypatch, width)
    codec = CodecConfig(INPUT, "float32", task, model_name="table")
    config = InstanceConfig(1, SLOTS, (min(os.sched_getaffinity(0)),), runtime="onnxruntime-thread")
    with InstancePool(ModelConfig("tiny"), [config], codec=codec, gather_ms=0) as pool:
        instance = pool.supervisor.instances[0]
        assert instance.kind == "thread"
        # the cause itself, seen however libgomp spins: once another OpenMP team lives in this process
        # (this test process's main thread may lead one), its barriers spin briefly and the cost hides
        assert instance.worker.call(torch.get_num_threads).result(10) == 1
        for batch in BATCHES:
            stages = stage_medians(pool, batch)
            assert stages["decode"] < bound_ms(batch, INPUT[0]), (case, batch, stages)
            assert stages["encode"] < bound_ms(batch, width), (case, batch, stages)
