"""`packrat bench http` (issues 63 and 70): its summary and verdict from plain numbers, the plain server's
binary KServe v2 parsing, and the plain server itself on loopback, loaded by locust as the bench
loads it (integration)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from packrat.bench import plain_http
from packrat.bench.plain_server import HEADER, BadRequest, encode_answer, parse_infer


def runs(packrat_p50: list[float], plain_p50: list[float], packrat_rps: list[float], plain_rps: list[float],
         users: int = 1, failures: int = 0) -> list[dict]:
    """Locust runs of both servers at `users`, round by round."""
    found = []
    for server, p50s, rpss in (("packrat", packrat_p50, packrat_rps), ("plain", plain_p50, plain_rps)):
        found += [{"server": server, "users": users, "round": r, "p50_ms": p50, "rps": rps, "requests": 100,
                   "failures": failures if server == "packrat" else 0}
                  for r, (p50, rps) in enumerate(zip(p50s, rpss), 1)]
    return found


def test_ratios_are_paired_per_round_and_the_targets_met():
    # round 2 is slow for both servers: its ratio is what counts, not its figures
    summary = plain_http.summarise(runs([5.0, 10.0, 4.9], [5.0, 10.2, 5.0], [200.0, 102.0, 196.0],
                                        [200.0, 100.0, 196.0]))
    row = summary[1]
    assert row["packrat"]["p50_ms"] == {"median": 5.0, "spread": [4.9, 10.0]}
    assert row["p50_ms_ratio"]["median"] == pytest.approx(10 / 10.2)
    assert row["p50_ms_ratio"]["spread"] == pytest.approx([0.98, 1.0])
    assert row["rps_ratio"]["median"] == pytest.approx(1.0) and row["rps_ratio"]["spread"][1] == pytest.approx(1.02)
    assert row["verdict"] == {"met": True, "missed": []}
    assert row["packrat"]["requests"] == 300 and row["plain"]["failures"] == 0


def test_a_slower_packrat_misses_and_says_why():
    summary = plain_http.summarise(runs([12.0, 12.5], [5.0, 5.0], [80.0, 78.0], [190.0, 200.0], users=4))
    assert summary[4]["verdict"]["met"] is False
    assert summary[4]["verdict"]["missed"] == ["p50 2.450 > 1.0", "req/s 0.406 < 1.0"]
    [line] = plain_http.verdict_lines(summary)
    assert line.startswith("verdict at 4 user(s)") and "missed (p50 2.450 > 1.0; req/s 0.406 < 1.0)" in line


def test_failed_requests_or_a_server_not_measured_miss():
    failed = plain_http.summarise(runs([5.0], [5.0], [200.0], [200.0], failures=3))[1]["verdict"]
    assert failed == {"met": False, "missed": ["3 failed request(s)"]}
    alone = [r for r in runs([5.0], [5.0], [200.0], [200.0]) if r["server"] == "packrat"]
    assert plain_http.summarise(alone)[1]["verdict"]["missed"] == ["p50 not measured", "req/s not measured"]


def test_the_report_has_every_figure_the_verdicts_and_the_shared_cores():
    found = runs([5.0, 6.0], [5.0, 5.0], [200.0, 190.0], [200.0, 200.0]) + \
        runs([20.0, 21.0], [19.0, 20.0], [200.0, 190.0], [210.0, 200.0], users=4)
    report = {"header": "tiny, B = 4", "summary": plain_http.summarise(found)}
    text = plain_http.format_report(report)
    assert "| 1 | packrat | 5.50 (5.00–6.00) | 195.0 (190.0–200.0) | 200 | 0 |" in text
    assert "| 4 | 1.051 (1.050–1.053) | 0.951 (0.950–0.952) |" in text
    targets = "(packrat / plain: p50 ≤ 1.0, req/s ≥ 1.0, none failed)"
    assert f"verdict at 1 user(s) {targets}: missed (p50 1.100 > 1.0; req/s 0.975 < 1.0)" in text
    assert f"verdict at 4 user(s) {targets}: missed (p50 1.051 > 1.0; req/s 0.951 < 1.0)" in text
    assert "locust runs on the same cores" in text


def test_packrat_is_warmed_up_until_it_serves_its_plan_for_the_users_and_no_longer(tmp_path):
    """Each users count warms up both servers once, then packrat again while its status shows a plan
    for another batch: here it switches after its second warm-up; one that never switches stops at
    SWITCH_WARMUPS and its plan is reported as it is."""
    import argparse

    args = argparse.Namespace(warmup=1.0)
    loads = []
    plans = iter([{"batch": 4}, {"batch": 4}, {"batch": 4}, {"batch": 1}, {"batch": 1}])
    batches = []

    def plan():
        batches.append(next(plans, {"batch": 1}))
        return batches[-1]

    got = plain_http.warm_up({"packrat": "p", "plain": "q"}, plan, lambda url, users, s, where: loads.append(url),
                             1, args, tmp_path)
    assert got == {"batch": 1} and loads == ["p", "q", "p"]
    stuck = []
    got = plain_http.warm_up({"packrat": "p", "plain": "q"}, lambda: {"batch": 4},
                             lambda url, users, s, where: stuck.append(url), 1, args, tmp_path)
    assert got == {"batch": 4} and stuck == ["p", "q"] + ["p"] * (plain_http.SWITCH_WARMUPS - 1)


def test_the_header_names_the_plans_packrat_served_in_its_rounds_not_after_its_warm_up():
    """The plan after the warm-up may be a trial's, reverted as the rounds begin: the header names
    what each round ended on, with counts where the rounds differ."""
    import argparse

    args = argparse.Namespace(model="squeezenet", batch_size=4, max_batch_delay=50, rounds=4, duration=6, warmup=6)
    thread, process = ({"instances": [{"threads": 2, "batch": 1, "runtime": kind}]}
                       for kind in ("onnxruntime-thread", "onnxruntime"))
    runs = [{"server": "packrat", "users": 1, "round": r, "plan": plain_http.plan_text(thread if r < 4 else process)}
            for r in range(1, 5)] + [{"server": "plain", "users": 1, "round": 1}]
    runs += [{"server": "packrat", "users": 4, "round": r, "plan": plain_http.plan_text(thread)} for r in range(1, 5)]
    text = plain_http.header(args, 2, {1: process, 4: thread}, runs)
    assert ("1 user(s): ⟨2, 1, onnxruntime-thread⟩ (3 of 4 rounds), ⟨2, 1, onnxruntime⟩ (1 of 4 rounds); "
            "4 user(s): ⟨2, 1, onnxruntime-thread⟩;") in text
    assert "1 user(s): ⟨2, 1, onnxruntime⟩;" in plain_http.header(args, 2, {1: process})  # no rounds: the warm-up's


def test_the_command_defaults():
    from packrat.cli.main import build_parser

    args = build_parser().parse_args(["bench", "http"])
    assert (args.model, args.batch_size, args.rounds, args.duration) == ("squeezenet", 4, 10, 8.0)
    assert args.max_batch_delay == 50 and not args.json
    assert args.func.__module__ == "packrat.cli.bench_http"


INPUTS = {"input": ("FP32", ["batch", 3, 2, 2])}


def body_of(x: np.ndarray, datatype: str = "FP32") -> tuple[bytes, str]:
    head = (f'{{"inputs":[{{"name":"x","shape":{list(x.shape)},"datatype":"{datatype}",'
            f'"parameters":{{"binary_data_size":{x.nbytes}}}}}]}}').encode()
    return head + x.tobytes(), str(len(head))


def test_a_binary_v2_request_is_read_without_copying_and_the_answer_written_back():
    x = np.arange(24, dtype="<f4").reshape(2, 3, 2, 2)
    feeds = parse_infer(*body_of(x), INPUTS)
    assert list(feeds) == ["input"] and np.array_equal(feeds["input"], x)  # one input: any name
    body, length = encode_answer("m", "out", x[:, :, 0, 0])
    assert body[:length] == (b'{"model_name":"m","outputs":[{"name":"out","datatype":"FP32","shape":[2,3],'
                             b'"parameters":{"binary_data_size":24}}]}')
    assert np.array_equal(np.frombuffer(body[length:], "<f4").reshape(2, 3), x[:, :, 0, 0])


def test_bad_bodies_are_refused_with_a_reason():
    x = np.zeros((2, 3, 2, 2), "<f4")
    good, length = body_of(x)
    cases = [((good, None), f"no {HEADER}"), ((good, "x"), "no byte count"), ((good, "99999"), "no byte count"),
             ((b"{not json", "9"), "not JSON"), ((good[:-4], length), "binary_data_size 96 is not FP32"),
             ((good + b"x", length), "do not add up"), (body_of(x.astype("<i8"), "INT64"), "is FP32 .* not INT64"),
             (body_of(x.reshape(2, 3, 4)), "is FP32")]
    for (body, header), match in cases:
        with pytest.raises(BadRequest, match=match):
            parse_infer(body, header, INPUTS)


@pytest.mark.integration
def test_the_plain_server_answers_as_its_session_and_refuses_a_bad_body(tmp_path):
    import requests

    from packrat.bench.plain_server import plain_serving, plain_session
    from packrat.codec.payloads import v2_binary_payload
    from packrat.deploy.torchserve import free_port
    from packrat.loadtest import run_locust
    from packrat.models.zoo import resolve

    spec = resolve("tiny")
    body, content_type, length = v2_binary_payload(spec)
    session = plain_session("tiny")  # builds the ONNX file the server then finds
    expected = session.run(None, {session.get_inputs()[0].name: spec.example_inputs(1)[0].numpy()})[0]
    with plain_serving("tiny", tmp_path, free_port(), timeout=120) as url:
        answer = requests.post(f"{url}/v2/models/tiny/infer", data=body, timeout=30,
                               headers={"Content-Type": content_type, HEADER: str(length)})
        refused = requests.post(f"{url}/v2/models/tiny/infer", data=body[:-1], timeout=30,
                                headers={"Content-Type": content_type, HEADER: str(length)})
        load = run_locust(url, "tiny", 1, 1, tmp_path / "locust", payload=(body, content_type),
                          path="/v2/models/tiny/infer", header_length=length)  # as the bench loads it
    assert answer.status_code == 200
    split = int(answer.headers[HEADER])
    assert json.loads(answer.content[:split])["outputs"][0]["shape"] == list(expected.shape)
    assert np.array_equal(np.frombuffer(answer.content[split:], "<f4").reshape(expected.shape), expected)
    assert refused.status_code == 400 and "binary_data_size" in refused.json()["error"]
    assert "\n" not in refused.json()["error"]
    assert load.requests > 0 and load.failures == 0
