"""The packrat handler inside a real ts.context.Context, without Java."""

from __future__ import annotations

import json

import pytest
import torch
from ts.context import Context, RequestProcessor

from handlers.packrat_handler import PackratHandler
from handlers.stock_handler import StockHandler
from packrat.models import prepare, resolve
from packrat.topology import detect

PROFILE = "threads,batch,latency_ms\n" + "".join(
    f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in range(1, detect().num_cores + 1) for b in (1, 2, 4))


def make_context(tmp_path, batch=4, plan="auto") -> Context:
    (tmp_path / "profile.csv").write_text(PROFILE)
    config = {"packrat": {"model": "tiny", "profile": "profile.csv", "plan": plan, "input_shape": None}}
    return Context("tiny", str(tmp_path), {}, batch, None, "0.12", model_yaml_config=config)


def with_requests(context: Context, content_types: list[str]) -> Context:
    context.request_processor = [RequestProcessor({"body": {"content-type": ct}}) for ct in content_types]
    return context


@pytest.fixture(scope="module")
def expected():
    module, _, _ = prepare(resolve("tiny"), 2)
    samples = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        logits = module(samples)
    return samples, [torch.softmax(row, 0).topk(5).indices.tolist() for row in logits]


@pytest.mark.parametrize("handler_class", [PackratHandler, StockHandler])
def test_mixed_batch_bad_requests_fail_alone(tmp_path, expected, handler_class):
    samples, classes = expected
    handler = handler_class()
    context = make_context(tmp_path)
    handler.initialize(context)
    try:
        rows = [
            {"body": bytearray(samples[0].numpy().tobytes())},
            {"body": bytearray(b"not a tensor")},
            {"body": {"inputs": samples[1].tolist()}},
            {"body": bytearray(b'{"inputs": [1,')},
            {"data": bytearray(samples[2].numpy().tobytes())},
        ]
        with_requests(context, ["application/octet-stream", "application/octet-stream", "application/json",
                                "application/json", "application/octet-stream"])
        responses = handler.handle(rows, context)
        assert len(responses) == 5
        for index, sample in ((0, 0), (2, 1), (4, 2)):
            assert [p["class"] for p in responses[index]["predictions"]] == classes[sample]
            assert context.get_response_status(index)[0] in (None, 200)
        assert context.get_response_status(1) == (400, responses[1]["error"])
        assert responses[1]["error"].startswith("wrong size: 12 bytes")
        assert context.get_response_status(3)[0] == 400 and "not valid JSON" in responses[3]["error"]
        json.dumps(responses)  # TorchServe sends them as JSON
        # a batch of nothing but bad requests never reaches the model
        with_requests(context, ["application/octet-stream"])
        assert handler.handle([{"body": bytearray(b"x")}], context)[0]["error"].startswith("wrong size")
    finally:
        if hasattr(handler, "pool"):
            handler.pool.close()


def test_packrat_handler_plans_for_the_worker_cores(tmp_path):
    handler = PackratHandler()
    handler.initialize(make_context(tmp_path, batch=4))
    try:
        assert handler.plan.threads == detect().num_cores
        assert sum(i.batch for i in handler.plan.instances) == 4
        assert handler.plan.threads_used <= detect().num_cores
    finally:
        handler.pool.close()
    fat = PackratHandler()
    fat.initialize(make_context(tmp_path, batch=4, plan="fat"))
    try:
        assert [(i.threads, i.batch) for i in fat.plan.instances] == [(detect().num_cores, 4)]
    finally:
        fat.pool.close()


def test_archive_without_packrat_settings_is_a_clear_error(tmp_path):
    context = Context("tiny", str(tmp_path), {}, 4, None, "0.12", model_yaml_config={})
    with pytest.raises(ValueError, match="packrat archive"):
        PackratHandler().initialize(context)
