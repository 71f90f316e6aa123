"""The packrat handler inside a real ts.context.Context, without Java."""

from __future__ import annotations

import json
import time

import pytest
import torch
from ts.context import Context, RequestProcessor

from packrat.handlers import careful_handler, common
from packrat.handlers.careful_handler import CarefulHandler
from packrat.handlers.packrat_handler import PackratHandler
from packrat.handlers.stock_handler import StockHandler
from packrat.models.zoo import prepare, resolve
from packrat.machine.topology import detect
from packrat.settings import NODE_DIR_ENV, SERVED_DIR_ENV, Settings

PROFILE = "threads,batch,latency_ms\n" + "".join(
    f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in range(1, detect().num_cores + 1) for b in (1, 2, 4))


def make_context(tmp_path, batch=4, plan="auto", **packrat) -> Context:
    (tmp_path / "profile.csv").write_text(PROFILE)
    config = {"packrat": {"model": "tiny", "profiles": ["profile.csv"], "plan": plan, "max_batch": batch, **packrat}}
    return Context("tiny", str(tmp_path), {}, batch, None, "0.12", model_yaml_config=config)


def with_requests(context: Context, content_types: list[str]) -> Context:
    context.request_processor = [RequestProcessor({"body": {"content-type": ct}}) for ct in content_types]
    return context


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """started(plan): a PackratHandler for the tiny model with that plan ("auto" or "fat"),
    initialised once for the module (its engine starts a pool of instance processes, each a
    fresh Python importing torch) and closed at its end. Tests hand it contexts of their own.
    Its node directory is its own: the engines other tests start beside it plan the cores as if
    alone, as they would without it."""
    handlers: dict[str, PackratHandler] = {}

    def handler(plan: str = "auto") -> PackratHandler:
        if plan not in handlers:
            with pytest.MonkeyPatch.context() as env:
                env.setenv(NODE_DIR_ENV.name, str(tmp_path_factory.mktemp("node")))
                handlers[plan] = PackratHandler()
                handlers[plan].initialize(make_context(tmp_path_factory.mktemp(plan), plan=plan))
        return handlers[plan]

    yield handler
    for handler in handlers.values():
        handler.engine.close()


@pytest.fixture(scope="module")
def expected():
    module, _, _ = prepare(resolve("tiny"), 2, "eager")  # the model itself: nothing compiled for the reference
    samples = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        logits = module(samples)
    return samples, [torch.softmax(row, 0).topk(5).indices.tolist() for row in logits]


# The in-process handlers run the model eagerly or in a session, as the claim is about requests
# failing alone, not about compiling (which costs 30 s here)
IN_PROCESS = {StockHandler: {"graph_mode": "eager"}, CarefulHandler: {"runtime": "onnxruntime"}}


@pytest.mark.parametrize("handler_class", [PackratHandler, StockHandler, CarefulHandler])
@pytest.mark.slow
def test_mixed_batch_bad_requests_fail_alone(tmp_path, expected, handler_class, started):
    samples, classes = expected
    context = make_context(tmp_path, **IN_PROCESS.get(handler_class, {}))
    if handler_class is PackratHandler:
        handler = started()
    else:
        handler = handler_class()
        before = torch.get_num_threads()
        handler.initialize(context)
        torch.set_num_threads(before)  # the careful handler set this process's count for itself
    rows = [
        {"body": bytearray(samples[0].numpy().tobytes())},
        {"body": bytearray(b"not a tensor")},
        {"body": {"inputs": samples[1].tolist()}},  # TorchServe decoded the JSON already
        {"body": bytearray(b'{"inputs": [1,')},
        {"data": bytearray(samples[2].numpy().tobytes())},
        {"body": bytearray(b"[" * 50_000 + b"]" * 50_000)},  # TorchServe's own json.loads gave up
    ]
    with_requests(context, ["application/octet-stream", "application/octet-stream", "application/json",
                            "application/json", "application/octet-stream", "application/json"])
    responses = [json.loads(r) for r in handler.handle(rows, context)]
    assert len(responses) == 6
    for index, sample in ((0, 0), (2, 1), (4, 2)):
        assert [p["class"] for p in responses[index]["predictions"]] == classes[sample]
        assert context.get_response_status(index)[0] in (None, 200)
    for index in (1, 3, 5):
        assert context.get_response_status(index) == (400, responses[index]["error"])
    # a batch of nothing but bad requests never reaches the model
    with_requests(context, ["application/octet-stream"])
    assert "error" in json.loads(handler.handle([{"body": bytearray(b"x")}], context)[0])


@pytest.mark.slow
def test_a_batch_reaches_the_instance_whole_and_the_status_says_where_its_time_went(tmp_path, expected, started):
    """The handler submits TorchServe's batch together: one sub-batch per batch (ordinary mode
    starts instances at once, so a request submitted alone would go out alone)."""
    samples, classes = expected
    handler, context = started("fat"), make_context(tmp_path, batch=4, plan="fat")
    handler.pool.stages.clear()  # the status's figures from here on (the count since start stays)
    sub_batches = handler.pool.stages.sub_batches
    rows = [{"body": bytearray(sample.numpy().tobytes())} for sample in samples]
    with_requests(context, ["application/octet-stream"] * len(rows))
    for _ in range(5):
        responses = [json.loads(r) for r in handler.handle(rows, context)]
        assert [[p["class"] for p in r["predictions"]] for r in responses] == classes
    health = handler.describe_handle()["health"]
    assert (health["sub_batches"] - sub_batches, health["requests_per_sub_batch"]) == (5, len(rows))
    assert {"queue", "wake", "decode", "model", "encode", "reply", "total"} <= set(health["stage_ms"])


@pytest.mark.slow
def test_describe_returns_the_status(tmp_path, started):
    handler, context = started(), make_context(tmp_path)
    context.request_processor = [RequestProcessor({"describe": "True"})]
    (status,) = handler.handle([{"body": b""}], context)
    assert status["plan"]["batch"] == 4 and status["health"]["ready"] == len(status["plan"]["instances"])


@pytest.mark.slow
def test_packrat_handler_plans_for_the_worker_cores(started):
    handler = started()  # batch 4, as TorchServe's
    assert handler.plan.threads == detect().num_cores
    assert sum(i.batch for i in handler.plan.instances) == 4
    assert handler.plan.threads_used <= detect().num_cores
    assert [(i.threads, i.batch) for i in started("fat").plan.instances] == [(detect().num_cores, 4)]


@pytest.mark.slow
def test_instances_gather_only_when_requests_arrive_one_by_one(tmp_path, started):
    """TorchServe hands the handler whole batches, so an idle instance never waits for the rest of
    its share (gather 0 ms); an asynchronous front end (Ray Serve's, one request at a time) waits
    the default 30 ms."""
    from packrat.serving.engine import Engine

    assert started().pool.dispatcher.gather_s == 0.0
    engine = Engine(common.settings(make_context(tmp_path)), tmp_path, "tiny", max_batch=4, asynchronous=True)
    try:
        assert engine.pool.dispatcher.gather_s == 0.03
    finally:
        engine.close()


def test_instances_run_the_model_as_its_profile_measured_it(tmp_path):
    """Instances run in the profile's mode (compile, script or eager); the archive's own setting
    wins; no profile means the default; a mismatch (instances that fell back to eager) is said."""
    from packrat.serving.engine import mode_mismatch, model_config

    settings = Settings("tiny")
    for mode in ("eager", "script", "compile"):
        assert model_config(settings, str(tmp_path), mode)[0].graph_mode == mode
    assert model_config(settings, str(tmp_path), None)[0].graph_mode == "compile"
    assert model_config(settings, str(tmp_path), "ios")[0].graph_mode == "compile"  # ios_cache decides those
    assert model_config(settings.replace(graph_mode="eager"), str(tmp_path), "script")[0].graph_mode == "eager"
    assert model_config(settings.replace(graph_mode="compile"), str(tmp_path), "eager")[0].graph_mode == "compile"
    assert model_config(settings, str(tmp_path), "script")[0].compile_cache == str(tmp_path)
    assert mode_mismatch("script", "script") is None and mode_mismatch(None, "eager") is None
    assert mode_mismatch("compile", "onnxruntime") is None  # a pool of another runtime runs no graph mode
    assert "measured in script mode but the instances run in eager mode" in mode_mismatch("script", "eager")


@pytest.mark.slow
def test_an_eager_profile_is_served_eager(tmp_path):
    context = make_context(tmp_path)
    (tmp_path / "profile.csv").write_text("# mode: eager\n" + PROFILE)
    handler = PackratHandler()
    handler.initialize(context)
    try:
        assert handler.pool.mode == "eager"
    finally:
        handler.engine.close()


def test_archive_without_packrat_settings_is_a_clear_error(tmp_path):
    context = Context("tiny", str(tmp_path), {}, 4, None, "0.12", model_yaml_config={})
    with pytest.raises(ValueError, match="packrat archive"):
        PackratHandler().initialize(context)


def test_recovery_settings_from_the_archive_reach_the_pool():
    from packrat.serving.engine import pool_settings
    from packrat.serving.pool.supervisor import Watchdog

    assert pool_settings(Settings("tiny")) == {}
    given = Settings.from_section({"model": "tiny", "request_timeout_s": 30, "max_queue": "50", "gather_ms": 10,
                                   "hang_floor_s": 2, "hang_factor": 4, "batch_timeout_s": None})
    assert pool_settings(given) == {
        "request_timeout_s": 30.0, "max_queue": 50, "gather_ms": 10.0, "watchdog": Watchdog(factor=4.0, floor_s=2.0)}
    assert pool_settings(Settings("tiny", batch_timeout_s=9))["watchdog"].allowance_s(None, 0.0, 1) == 9


@pytest.mark.integration
def test_the_stock_handler_runs_the_runtime_it_is_given(tmp_path, expected):
    """`runtime: onnxruntime` in the archive: stock runs what packrat's instances may run, so the two
    handlers can be compared on one engine (issue 41); the answers are the model's."""
    pytest.importorskip("onnxruntime")
    samples, classes = expected
    handler = StockHandler()
    context = make_context(tmp_path, runtime="onnxruntime")
    handler.initialize(context)
    assert type(handler.model).__name__ == "OrtRunner"
    with_requests(context, ["application/octet-stream"])
    (response,) = handler.handle([{"body": bytearray(samples[0].numpy().tobytes())}], context)
    assert [p["class"] for p in json.loads(response)["predictions"]] == classes[0]


@pytest.mark.slow
def test_a_batch_that_waited_in_torchserves_queue_past_its_deadline_is_not_run(tmp_path, expected):
    """TorchServe's queue (jobQueueSize 4) hands over batches of up to 4. A batch after a short
    one waited at most since it; one that may have waited 5 s, past the 1 s deadline, is answered
    504 at once, its bodies untouched and no instance running it."""
    samples, classes = expected
    context = make_context(tmp_path, batch=4, plan="fat", request_timeout_s=1.0, reconfigure=False)
    context.model_yaml_config["jobQueueSize"] = 4
    handler = PackratHandler()
    handler.initialize(context)
    try:
        rows = [{"body": bytearray(sample.numpy().tobytes())} for sample in samples]
        with_requests(context, ["application/octet-stream"] * len(rows))
        for _ in range(2):  # a short batch: TorchServe's queue was empty after it
            responses = [json.loads(r) for r in handler.handle(rows, context)]
            assert [[p["class"] for p in r["predictions"]] for r in responses] == classes
        answered = handler.pool.health().answered
        handler.upstream.rounds.clear()
        handler.upstream.rounds.append((time.monotonic() - 5.0, 4))  # a full batch 5 s ago, nothing since
        responses = [json.loads(r) for r in handler.handle(rows, context)]
        assert all("waited 5.0" in r["error"] for r in responses)
        assert [context.get_response_status(i)[0] for i in range(len(rows))] == [504] * len(rows)
        health = handler.pool.health()
        assert (health.answered, health.expired) == (answered, len(rows))
    finally:
        handler.engine.close()


@pytest.mark.integration
def test_the_careful_handler_runs_a_plain_session_on_every_core_and_decodes_in_parallel(tmp_path, expected, request):
    """What a careful user writes (issue 63): the runtime's own session with its defaults and a thread
    per core, decoders on every core (beside which the session's threads stop spinning, issue 70),
    torch's intra-op threads at 1 where it only decodes, one batch of rows the session reads; a full
    batch answered as the model answers."""
    pytest.importorskip("onnxruntime")
    import os

    samples, classes = expected
    handler = CarefulHandler()
    context = make_context(tmp_path, batch=3, runtime="onnxruntime")
    before = torch.get_num_threads()
    handler.initialize(context)
    request.addfinalizer(lambda: torch.set_num_threads(before))  # the handler set this process's count
    options = handler.model.session.get_session_options()
    assert options.intra_op_num_threads == len(os.sched_getaffinity(0))
    assert options.inter_op_num_threads == 0  # the runtime's default, not packrat's one
    if handler.decoders.parallel:  # its threads stop spinning beside the decoders, as packrat's instances' do
        assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    else:
        with pytest.raises(Exception):  # nothing shares their cores after a run: they spin on
            options.get_session_config_entry("session.force_spinning_stop")
    assert torch.get_num_threads() == 1
    assert handler.rows.slots == 3
    with_requests(context, ["application/octet-stream"] * 3)
    responses = handler.handle([{"body": bytearray(sample.numpy().tobytes())} for sample in samples], context)
    assert [[p["class"] for p in json.loads(r)["predictions"]] for r in responses] == classes


def test_the_careful_handler_warms_every_batch_size_and_says_what_differs(tmp_path, monkeypatch, request, caplog):
    """Each size of the halving ladder warmed up, as the pool's instances do (issue 70); its session
    told to stop spinning exactly where its decoders run in parallel; its start says how it is not
    packrat's instance."""
    sizes, asked = [], {}

    def prepare_runtime(spec, runtime, batch, threads, shipped=None, plain=False, stop_spinning=None):
        asked.update(plain=plain, stop_spinning=stop_spinning)
        return (lambda x: sizes.append(len(x)) or torch.zeros(len(x), 10)), spec.example_inputs(batch)

    monkeypatch.setattr(careful_handler, "prepare_runtime", prepare_runtime)
    before = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(before))  # the handler sets this process's count
    handler = CarefulHandler()
    with caplog.at_level("INFO", logger=careful_handler.log.name):
        handler.initialize(make_context(tmp_path, batch=4, runtime="onnxruntime"))
    assert sorted(set(sizes)) == [1, 2, 4]
    assert asked == {"plain": True, "stop_spinning": handler.decoders.parallel}
    assert "unlike a packrat instance: one session on all the worker's cores" in caplog.text


def test_the_worker_notes_when_torchserve_begins_sending_each_message(monkeypatch):
    """TorchServe's worker loop reads each message (and json-decodes its bodies) before the handler
    runs: the wrapped retrieve_msg notes when its first bytes were there, before that reading."""
    import socket
    import sys
    import threading
    import types

    from packrat.frontends.torchserve_control import note_batch_sends

    worker, order = types.ModuleType("__main__"), []
    worker.TorchModelServiceWorker = object

    def retrieve_msg(conn):
        order.append("read")
        return conn.recv(16)

    worker.retrieve_msg = retrieve_msg
    monkeypatch.setitem(sys.modules, "__main__", worker)
    noted = []
    assert note_batch_sends(lambda at: (noted.append(at), order.append("noted")))
    ours, java = socket.socketpair()
    with ours, java:
        threading.Timer(0.2, java.sendall, (b"I batch",)).start()
        started = time.monotonic()
        assert worker.retrieve_msg(ours) == b"I batch"
    assert order == ["noted", "read"] and noted[0] - started >= 0.15


def test_outside_a_torchserve_worker_nothing_is_wrapped(monkeypatch):
    import sys
    import types

    from packrat.frontends.torchserve_control import note_batch_sends

    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    assert not note_batch_sends(print)


def test_the_handler_says_what_torchserves_queue_should_hold_at_the_pace_served(caplog, tmp_path, monkeypatch):
    """Archive-sized for 164 requests at a 2 s deadline; JSON bodies served a full batch of 4 every
    0.6 s: the queue that fits holds 4. The status says so, the log once, with the option that
    changes it now (TorchServe fixes the queue when it registers the model), and the pace is
    remembered for the model's next archive."""
    from packrat.frontends.torchserve_control import remembered_queue_pace
    from packrat.serving.pool.admission import UpstreamWait

    monkeypatch.setenv(SERVED_DIR_ENV.name, str(tmp_path))
    handler = PackratHandler.__new__(PackratHandler)
    handler.upstream, handler.max_batch, handler.served_name, handler._remembered = UpstreamWait(164, 4), 4, "m", None
    handler.deadline_s, handler.max_queue, handler._queue_told = 2.0, 1000, False
    assert handler.torchserve_queue() == {"size": 164, "fits_at_served_pace": None, "served_cycle_ms": None}
    for k in range(6):
        handler.upstream.arrived(k * 0.6 + 0.5, 4, sent_at=k * 0.6)
        handler.upstream.answered(k * 0.6 + 0.58)
    with caplog.at_level("WARNING"):
        handler._follow_queue_pace()
        handler._follow_queue_pace()
    assert handler.torchserve_queue() == {"size": 164, "fits_at_served_pace": 4, "served_cycle_ms": 600.0}
    (line,) = [r.getMessage() for r in caplog.records if "TorchServe's queue holds" in r.getMessage()]
    assert "a batch of 4 every 600 ms" in line and "--max-queue 4" in line
    assert remembered_queue_pace(tmp_path, "m", 4) == pytest.approx(0.6)
    assert remembered_queue_pace(tmp_path, "m", 8) is None  # another batch: another pace
