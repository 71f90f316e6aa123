"""answer_batch (packrat.codec.batch) as the pool's instances call it: decoding on a thread
pool, its stages stamped; and the instance's decoder threads (packrat.serving.pool.child)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from packrat.codec.codec import Codec
from packrat.codec.config import CodecConfig
from packrat.codec.payloads import build_payload
from packrat.models.zoo import prepare, resolve
from packrat.codec.batch import answer_batch
from packrat.codec.batch import Decoders, _on_a_new_thread, own_intra_op_threads


@pytest.fixture(scope="module")
def tiny():
    module, _, _ = prepare(resolve("tiny"), 4, graph_mode="eager")
    return module, Codec(CodecConfig.for_model(resolve("tiny")))


def mixed_bodies() -> list[tuple]:
    """Photos with bad bodies between them: a truncated JPEG, something that is no image, nothing."""
    photo, kind = build_payload("tiny", "jpeg")
    return [(photo, kind), (photo[:500], kind), (photo, kind), (b"not an image", "image/png"), (b"", kind),
            (memoryview(photo), kind)]


def test_decoding_on_threads_answers_as_decoding_in_turn(tiny):
    module, codec = tiny
    bodies = mixed_bodies()
    in_turn = answer_batch(module, codec, bodies)
    with ThreadPoolExecutor(2) as threads:
        on_threads = answer_batch(module, codec, bodies, threads.map)
    assert [a.status for a in on_threads] == [a.status for a in in_turn] == [200, 400, 200, 400, 400, 200]
    assert [json.loads(a.body) for a in on_threads] == [json.loads(a.body) for a in in_turn]
    assert all("\n" not in a.reason for a in on_threads)


def test_laps_stamp_decode_run_and_encode_in_order(tiny):
    module, codec = tiny
    laps = [0.0]
    answer_batch(module, codec, mixed_bodies(), laps=laps)
    assert len(laps) == 4 and laps == sorted(laps)
    only_bad = [0.0]
    answer_batch(module, codec, [(b"", "image/jpeg")], laps=only_bad)  # nothing reaches the model: still 3 laps
    assert len(only_bad) == 4


def test_decoders_decode_in_parallel_only_when_there_is_more_than_one():
    assert Decoders(1).mapper(4) is map
    decoders = Decoders(2)
    assert decoders.mapper(1) is map and decoders.mapper(2) is not map


def test_decoder_threads_run_one_intra_op_thread_and_leave_the_models_count():
    """A decoder's tensor work must not start a second OpenMP team, and the model's thread (here
    the main one) keeps its count even though torch's process-wide setting was last set to 1."""
    code = ("import json, torch\n"
            "from packrat.codec.batch import Decoders, set_intra_op_threads\n"
            "decoders = Decoders(2)\n"
            "set_intra_op_threads(2)\n"
            "seen = list(decoders.mapper(4)(lambda _: ((torch.ones(100_000) * 2).sum(), torch.get_num_threads())[1],"
            " range(4)))\n"
            "(torch.ones(100_000) * 2).sum()\n"
            "print(json.dumps({'decoders': seen, 'main': torch.get_num_threads()}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == {"decoders": [1, 1, 1, 1], "main": 2}


@pytest.fixture
def process_count_of_2():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_threads_own_count_leaves_the_processes(process_count_of_2):
    """A thread instance's threads run one intra-op thread each in a process whose count is its host's."""
    assert _on_a_new_thread(lambda: (own_intra_op_threads(1), torch.get_num_threads())[1]) == 1
    decoders = Decoders(2, process_wide=False)
    assert list(decoders.mapper(4)(lambda _: torch.get_num_threads(), range(4))) == [1, 1, 1, 1]
    assert _on_a_new_thread(torch.get_num_threads) == 2  # what a thread reads on its first parallel region
