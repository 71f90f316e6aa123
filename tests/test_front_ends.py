"""Several front-end processes behind one port (issue 70, part 3): how many a node needs and the cores
each gets (planning/front_ends.py), a process's share of a core (machine/cpu_time.py), every front
end's status and metrics as one (frontends/front_ends.py), what `packrat status` prints of them, the
body counted raw that keeps instances threads, the ceiling's report (bench/ceiling.py) and its load
client; and a real KServe server of 2 front ends on 2 cores, as `packrat serve --engine kserve
--front-ends 2` starts it: both answer, no core planned twice, status and metrics hold both, a killed
front end is started again while the other answers, and stopping stops every process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from packrat.planning.front_ends import FrontEnds, capacity_rps, choose, front_ends_count, needed, split_cores


# ---- how many, and which cores ------------------------------------------------------------------------

def test_capacity_is_what_the_instances_answer_back_to_back():
    assert capacity_rps([(8, 2.0), (4, 1.0)]) == pytest.approx(8000)  # 4000 + 4000 a second
    assert capacity_rps([(8, None), (4, float("nan")), (2, 0.0)]) == 0.0


@pytest.mark.parametrize("capacity, ceiling, cores, expected", [
    (40, 2500, 2, 1),  # ResNet-50: the instances are the ceiling
    (1370, 3000, 16, 1), (5470, 3000, 64, 2),  # a light model: 85 req/s a core
    (33642, 3405, 2, 2), (1e6, 2500, 16, 16), (112000, 3000, 16, 12),  # next to no cost: one a core, or nearly
    (2500, 2500, 1, 1), (5000, 0, 4, 4)])
def test_front_ends_are_their_share_of_the_cpu_at_saturation_one_at_least_one_a_core_at_most(
        capacity, ceiling, cores, expected):
    assert needed(capacity, ceiling, cores) == expected


def test_the_front_ends_share_is_what_a_saturated_node_spends_on_them():
    from packrat.planning.front_ends import share

    # a request costs the instances m = 16 / 48000 s of CPU and a front end f = 1 / 3000 s: half of it
    assert share(48000, 3000, 16) == pytest.approx(8.0)
    assert share(1e12, 3000, 16) == pytest.approx(16.0, rel=1e-6)  # a model of no cost: all of it


def test_auto_says_why_and_a_count_asked_for_is_kept_within_the_cores():
    auto = choose("auto", 33642.0, 3405.0, 2, "measured")
    assert auto.count == 2 and "33,642 req/s on 2 core(s)" in auto.why and "3,405 req/s per core (measured)" in auto.why
    assert "2 × 33,642 / (33,642 + 2 × 3,405) = 1.66 cores → 2" in auto.why
    assert choose("auto", 40.0, 2500.0, 2, "default").count == 1
    assert choose("auto", None, 2500.0, 8, "default").count == 1
    assert choose("3", None, 2500.0, 4, "default") == FrontEnds(3, "3 asked for (--front-ends 3)", None, 2500.0)
    with pytest.raises(ValueError, match="between 1 and the 2 cores"):
        choose("3", None, 2500.0, 2, "default")


def test_a_front_ends_value_is_a_count_or_auto():
    assert front_ends_count("auto") == "auto" and front_ends_count("4") == "4"
    for bad in ("0", "-1", "two", ""):
        with pytest.raises(ValueError):
            front_ends_count(bad)


def test_blocks_of_cores_are_disjoint_contiguous_and_cover_every_core():
    assert split_cores([0, 1], 2) == [(0,), (1,)]
    assert split_cores(list(range(16)), 3) == [tuple(range(0, 6)), tuple(range(6, 11)), tuple(range(11, 16))]
    blocks = split_cores(list(range(64)), 5)
    assert sorted(c for b in blocks for c in b) == list(range(64)) and {len(b) for b in blocks} == {12, 13}
    with pytest.raises(ValueError):
        split_cores([0, 1], 3)


def test_auto_weighs_the_lightest_models_plan_against_the_measured_ceiling(tmp_path, monkeypatch):
    from packrat.frontends.front_ends import decide, write_ceiling
    from packrat.machine.budget import cpu_budget
    from packrat.machine.topology import Topology
    from packrat.settings import SERVED_DIR_ENV, Settings

    monkeypatch.setenv(SERVED_DIR_ENV.name, str(tmp_path / "served"))
    budget = cpu_budget(topology=Topology.virtual(2), root=tmp_path)

    def model(name: str, scale: float, profile: bool = True, **more):
        folder = tmp_path / name
        folder.mkdir()
        rows = "".join(f"{t},{b},{b * 2.0 * scale / t ** 0.5}\n" for t in (1, 2) for b in (1, 2, 4))
        (folder / "p.csv").write_text("# model: tiny\n# mode: script\nthreads,batch,latency_ms\n" + rows)
        section = {"model": "tiny", "max_batch": 4, "profiles": ["p.csv" if profile else "missing.csv"], **more}
        return Settings.from_section(section), folder  # as an archive's model-config.yaml carries them

    slow, fast, broken = model("slow", 1.0), model("fast", 0.001), model("broken", 1.0, profile=False)
    alone = decide("auto", [slow], budget)  # 2 × ⟨1, 2⟩ in 4 ms: 1,000 req/s, a third of a core of front end
    assert alone.count == 1 and alone.capacity_rps == pytest.approx(1000) and "packrat's default" in alone.why
    assert decide("auto", [slow, fast], budget).count == 2  # 1,000,000 req/s: the loop bounds it
    write_ceiling(1e9, {"model": "trivial"})
    measured = decide("auto", [slow, fast], budget)
    assert measured.count == 1 and "measured by packrat bench http --ceiling" in measured.why
    assert decide("auto", [broken], budget).count == 1  # no capacity known: one front end, the engine says why
    one_core = decide("auto", [model("one", 1.0, cores=1)], budget)  # as its engine plans: ⟨1, 4⟩ in 8 ms
    assert one_core.capacity_rps == pytest.approx(500)
    assert decide("2", [broken], budget).count == 2


def test_each_server_is_started_with_the_supervisors_arguments_then_its_place(tmp_path):
    from packrat.frontends.front_ends import Supervisor
    from packrat.machine.topology import logical_cpus

    argv = ["--model-store", "store", "--http-port", "8080", "--front-ends", "auto", "--model", "m"]
    supervisor = Supervisor(argv, [(0,), (1,)], 7, tmp_path)
    command = supervisor.command(1)
    assert command[1:3] == ["-m", "packrat.frontends.kserve_server"] and command[3:3 + len(argv)] == argv
    # argparse keeps the last of a repeated option: the server serves alone, on its block, in its place
    cpus = ",".join(map(str, logical_cpus([1])))  # core 1 with its SMT siblings, where it has any
    assert command[3 + len(argv):] == ["--front-ends", "1", "--cores", cpus, "--front-end", "1/2", "--front-end-dir",
                                       str(tmp_path), "--rest-fd", "7"]


# ---- a process's share of a core ---------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now, self.cpu, self.loop, self.answered = 0.0, 0.0, 0.0, 0

    def advance(self, seconds: float, cpu: float, loop: float, answered: int) -> None:
        self.now += seconds
        self.cpu += cpu
        self.loop += loop
        self.answered += answered


def test_the_share_of_a_core_is_cpu_time_per_second_over_the_window():
    from packrat.machine.cpu_time import CpuMeter

    clock = Clock()
    meter = CpuMeter(lambda: clock.answered, window_s=10, clock=lambda: clock.now, process_s=lambda: clock.cpu,
                     loop_s=lambda: clock.loop)
    assert meter.shares()["cpu_share"] is None  # one reading: nothing to compare yet
    for _ in range(30):  # 30 s at half a core, 1000 answers a second; the window keeps about the last 10 s
        clock.advance(1.0, 0.5, 0.3, 1000)
        meter.sample()
    shares = meter.shares()
    assert shares["cpu_share"] == pytest.approx(0.5) and shares["loop_share"] == pytest.approx(0.3)
    assert shares["answered_rps"] == pytest.approx(1000) and shares["rps_per_core"] == pytest.approx(2000)
    assert 10 <= shares["seconds"] <= 11
    clock.advance(1.0, 0.0, 0.0, 0)
    meter.sample()
    assert meter.shares()["cpu_share"] < 0.5  # an idle second counts at once


def test_the_main_threads_cpu_time_is_read_from_another_thread():
    from packrat.machine.cpu_time import main_thread_cpu_s

    read = []
    thread = threading.Thread(target=lambda: read.append(main_thread_cpu_s()))
    thread.start()
    thread.join()
    assert 0 < read[0] <= time.process_time()


# ---- every front end's status and metrics as one -----------------------------------------------------

def test_status_holds_each_front_ends_view_of_a_model_and_names_one_that_did_not_answer():
    from packrat.frontends.front_ends import with_front_ends

    here = {"index": 1, "count": 3, "pid": 11, "cpu_share": 0.4}
    theirs = {"m": {"plan": {"batch": 4}, "front_end": {"index": 0, "pid": 10}}}
    merged = with_front_ends({"m": {"plan": {"batch": 8}}}, here,
                             [({"index": 0, "pid": 10}, json.dumps(theirs).encode()), ({"index": 2, "pid": 12}, None)])
    status = merged["m"]
    assert status["plan"] == {"batch": 8} and status["front_end"] == here
    assert [s["front_end"]["index"] for s in status["front_ends"]] == [0, 1, 2]
    assert status["front_ends"][0]["plan"] == {"batch": 4} and status["front_ends"][1]["plan"] == {"batch": 8}
    assert status["front_ends"][2] == {"front_end": {"index": 2, "pid": 12, "unreachable": True}}
    json.dumps(merged)  # no status holds itself
    alone = with_front_ends({"m": {"plan": {}}}, {"index": 0, "count": 1}, [])
    assert alone == {"m": {"plan": {}, "front_end": {"index": 0, "count": 1}}}


def test_metrics_of_several_front_ends_are_one_page_labelled_by_front_end():
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from packrat.frontends.front_ends import merged_metrics

    registry = CollectorRegistry()
    Counter("answered", "answers", ["model"], registry=registry).labels("m").inc(3)
    Histogram("latency", "seconds", registry=registry).observe(0.2)
    page = generate_latest(registry)
    merged = merged_metrics([(0, page), (1, page.decode()), (2, None)]).decode()
    assert merged.count("# TYPE answered_total counter") == 1 and merged.count("# TYPE latency histogram") == 1
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    answered = [s for s in families["answered"].samples if s.name == "answered_total"]
    assert sorted((s.labels["front_end"], s.labels["model"], s.value) for s in answered) == [("0", "m", 3.0),
                                                                                            ("1", "m", 3.0)]
    assert {s.labels["front_end"] for s in families["latency"].samples} == {"0", "1"}


def test_packrat_status_prints_each_front_ends_share_of_a_core():
    from packrat.cli.output import front_end_text

    one = {"index": 1, "count": 2, "pid": 42, "cores": [2, 3], "cpu_share": 0.91, "loop_share": 0.62,
           "answered_rps": 2512.4, "rps_per_core": 2761.0, "seconds": 10.2}
    assert front_end_text(one) == ("front end 1 of 2 (pid 42, cores 2-3): 0.91 of a core (its event loop 0.62), "
                                   "2512.4 req/s answered, 2,761 per core of its CPU time (last 10 s)")
    assert front_end_text({"index": 0, "count": 1, "pid": 7, "cores": None, "cpu_share": None}) == \
        "front end (pid 7): no CPU time measured yet"
    assert front_end_text({"index": 1, "count": 2, "pid": 8, "cores": [1], "unreachable": True}) == \
        "front end 1 of 2 (pid 8, cores 1): did not answer"


def test_a_binary_v2_body_of_one_row_counts_raw_and_keeps_thread_instances():
    from packrat.serving.payloads import SMALL_HEADER, one_row

    row = 3 * 32 * 32 * 4
    assert one_row(row, None, row)  # a raw tensor
    assert one_row(180 + row, "180", row) and one_row(180 + row, 180, row)  # tritonclient's one sample
    assert not one_row(180 + 2 * row, "180", row)  # two samples: decoded into two rows
    assert not one_row(SMALL_HEADER + 1 + row, SMALL_HEADER + 1, row)  # a long header takes a while to parse
    assert not one_row(30000, None, row) and not one_row(180 + row, "x", row)  # JSON; a header length that is none


# ---- the ceiling's report and its load --------------------------------------------------------------------

def ceiling_runs(packrat: list[float], plain: list[float], one: list[float], several: list[float]) -> list[dict]:
    from packrat.bench.ceiling import figures

    runs = []
    for case, values in (("packrat", packrat), ("plain", plain), ("packrat-all", one), ("packrat-2fe", several)):
        for round_, rps in enumerate(values, 1):
            cpu = 1.0 if case in ("packrat", "plain") else 2.0
            runs.append({"case": case, "round": round_, **figures(int(rps * 5), 0, 5.0, cpu * 5, 0.0, [1.0, 2.0, 3.0])})
    return runs


def test_the_ceilings_ratios_are_paired_per_round_and_say_whether_the_targets_are_met():
    from packrat.bench.ceiling import cases, summarise

    names = [c.name for c in cases([0, 1])]
    assert names == ["packrat", "plain", "packrat-all", "packrat-2fe"]
    assert [c.name for c in cases([0])] == ["packrat", "plain"]
    # round 2 is slow for every case: its ratios are what count
    summary = summarise(ceiling_runs([3000, 1500, 3100], [2000, 1000, 2000], [3000, 1500, 3000],
                                     [5000, 2700, 5400]), names)
    assert summary["cases"]["packrat"]["rps_per_core"] == {"median": 3000.0, "spread": [1500.0, 3100.0]}
    assert summary["per_core_ratio"]["median"] == pytest.approx(1.5)
    assert summary["raise"]["median"] == pytest.approx(1.8)
    assert summary["verdicts"] == ["req/s per front-end core, packrat / plain ≥ 1: 1.500, met",
                                   "req/s on every core, packrat-2fe / one front end > 1: 1.800, met",
                                   "failed requests: 0"]
    missed = summarise(ceiling_runs([1000], [2000], [3000], [2900]), names)["verdicts"]
    assert missed[:2] == ["req/s per front-end core, packrat / plain ≥ 1: 0.500, missed",
                          "req/s on every core, packrat-2fe / one front end > 1: 0.967, missed"]


def test_the_load_client_counts_answers_inside_its_window_only():
    from packrat.bench.load_client import LoadSpec, answer_length, http_request, merged, run_client

    assert answer_length(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\nX: y") == 12
    assert answer_length(b"HTTP/1.1 204 No Content\r\nX: y") == 0
    request = http_request("127.0.0.1", 1, "/v2/models/m/infer", b"abc", "application/octet-stream", 2)
    assert request.endswith(b"Inference-Header-Content-Length: 2\r\n\r\nabc") and b"Content-Length: 3" in request

    answered = []

    async def answer(reader, writer):
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                await reader.readexactly(3)
                answered.append(1)
                status = b"200 OK" if len(answered) % 10 else b"503 Busy"
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 5\r\n\r\nhello")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):  # the client closed it
            writer.close()

    async def serve(port_found, stop):
        server = await asyncio.start_server(lambda r, w: answer(r, w), "127.0.0.1", 0)
        port_found.append(server.sockets[0].getsockname()[1])
        while not stop.is_set():
            await asyncio.sleep(0.02)
        server.close()

    port, stop = [], threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(serve(port, stop)), daemon=True)
    thread.start()
    while not port:
        time.sleep(0.01)
    spec = LoadSpec("127.0.0.1", port[0], http_request("127.0.0.1", port[0], "/", b"abc", "text/plain"), 2,
                    time.monotonic() + 0.1, 0.2, 0.5)
    with ThreadPoolExecutor(1) as pool:  # its own event loop, as in a process of its own
        found = merged([pool.submit(run_client, spec).result()])
    stop.set()
    counted = found["answers"] + found["failed"]
    assert found["answers"] > 0 and found["failed"] > 0  # the 503s count as failed
    assert counted < len(answered)  # the warm-up's answers and those after the window are not counted
    assert len(found["latencies_ms"]) == counted


# ---- a real server of two front ends on two cores --------------------------------------------------------

PROFILE = "# mode: script\nthreads,batch,latency_ms\n" + "".join(
    f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in (1, 2) for b in (1, 2, 4))


def post(url: str, body: bytes, headers: dict) -> int:
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:  # no answer at all
        return 0


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def two_front_ends(tmp_path_factory):
    pytest.importorskip("kserve", reason="the KServe front end is an optional extra")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two front ends need two cores")
    from packrat.deploy import archive, kserve
    from packrat.deploy.torchserve import free_port
    from packrat.settings import Settings

    root = tmp_path_factory.mktemp("front-ends")
    (root / "tiny.csv").write_text("# model: tiny\n" + PROFILE)
    mar = archive.build(Settings("tiny", profiles=(str(root / "tiny.csv"),), max_batch=4), root / "store",
                        name="tiny", max_batch_delay_ms=5)
    cores = tuple(sorted(os.sched_getaffinity(0)))[:2]
    server = kserve.KServeServer(root / "run", ("tiny",), http_port=free_port(), grpc_port=free_port(),
                                 front_ends="2", cores=cores)
    kserve.start(server, [mar], timeout=300)
    try:
        yield server
    finally:
        kserve.stop(server)


def grpc_ready(address: str, times: int) -> bool:
    """The model ready through gRPC on `times` channels of their own (new connections each)."""
    import grpc
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

    answers = []
    for _ in range(times):
        with grpc.insecure_channel(address) as channel:
            answers.append(GRPCInferenceServiceStub(channel).ModelReady(pb.ModelReadyRequest(name="tiny"),
                                                                       timeout=30).ready)
    return all(answers)


def tiny_request() -> tuple[bytes, dict]:
    from packrat.codec.payloads import v2_binary_payload
    from packrat.models.zoo import resolve

    body, content_type, length = v2_binary_payload(resolve("tiny"))
    return body, {"Content-Type": content_type, "Inference-Header-Content-Length": str(length)}


@pytest.mark.integration
@pytest.mark.slow
def test_two_front_ends_each_answer_on_cores_of_their_own_and_one_view_holds_both(two_front_ends):
    from packrat.deploy import kserve

    server = two_front_ends
    choice, entries = kserve.front_ends(server)
    assert choice["count"] == 2 and len(entries) == 2 and choice["why"] == "2 asked for (--front-ends 2)"
    body, headers = tiny_request()
    for entry in entries:  # each answers on its own address
        assert post(f"{entry['url']}/v2/models/tiny/infer", body, headers) == 200
    with ThreadPoolExecutor(8) as pool:  # and through the port they share, every request answered
        statuses = list(pool.map(lambda _: post(f"{server.url}/v2/models/tiny/infer", body, headers), range(64)))
    assert statuses == [200] * 64
    status = kserve.status(server)["tiny"]
    views = status["front_ends"]
    assert [v["front_end"]["index"] for v in views] == [0, 1]
    assert {v["front_end"]["pid"] for v in views} == {e["pid"] for e in entries}
    assert sum(v["health"]["answered"] for v in views) >= 64 + 2  # the probes of zeros at start answered too
    blocks = [set(v["front_end"]["cores"]) for v in views]
    planned = [{c for i in v["plan"]["instances"] for c in i["cores"]} for v in views]
    assert not blocks[0] & blocks[1] and blocks[0] | blocks[1] == set(server.cores)  # no core given twice
    assert all(cores <= block for cores, block in zip(planned, blocks))  # each plans on its own block
    assert grpc_ready(server.grpc_address, times=8)  # gRPC: every front end binds the port (SO_REUSEPORT)
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as response:
        page = response.read().decode()
    for index in (0, 1):
        assert f'packrat_answered_requests_total{{front_end="{index}",model="tiny"}}' in page
        assert f'process_cpu_seconds_total{{front_end="{index}"}}' in page


@pytest.mark.integration
@pytest.mark.slow
def test_a_killed_front_end_is_started_again_while_the_other_answers_and_stop_ends_every_process(two_front_ends):
    import psutil

    from packrat.deploy import kserve

    server = two_front_ends
    _, entries = kserve.front_ends(server)
    killed = entries[1]
    os.kill(killed["pid"], signal.SIGKILL)
    while alive(killed["pid"]):
        time.sleep(0.05)
    body, headers = tiny_request()
    statuses = [post(f"{server.url}/v2/models/tiny/infer", body, headers) for _ in range(20)]
    assert statuses == [200] * 20  # new connections reach the front end that is there
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        _, now = kserve.front_ends(server)
        again = [e for e in now if e["index"] == 1 and e["pid"] != killed["pid"]]
        if again and kserve.model_ready(server, "tiny", again[0]["url"]):
            break
        time.sleep(0.5)
    else:
        pytest.fail("the killed front end was not started again")
    assert post(f"{again[0]['url']}/v2/models/tiny/infer", body, headers) == 200
    processes = [server.pid] + [p.pid for p in psutil.Process(server.pid).children(recursive=True)]
    assert len(processes) >= 3  # the supervisor, two front ends (and their instances)
    kserve.stop(server)
    assert not [pid for pid in processes if alive(pid)]
