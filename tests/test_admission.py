"""Admission by prediction (packrat/serving/pool/admission.py): plain numbers, no processes."""

import pytest

from packrat.serving.pool.admission import (
    Admission,
    Outlook,
    ServedRounds,
    UpstreamWait,
    answer_in_s,
    retry_after,
)
from packrat.serving.pool.api import Request
from packrat.serving.pool.dispatch import Dispatcher

ROUND = Outlook(busy_left_s=0.0, batch=4, round_s=0.35)


@pytest.mark.parametrize("queued, busy_left, expected", [
    (0, 0.0, 0.35),  # idle: its own batch
    (3, 0.0, 0.35),  # the fourth of a batch of four
    (4, 0.0, 0.70),  # the first of the next batch
    (4, 0.2, 0.90),  # ... behind a running batch's rest
    (15, 0.35, 1.75),
])
def test_answer_in_rounds(queued, busy_left, expected):
    assert answer_in_s(queued, busy_left, 4, 0.35) == pytest.approx(expected)


def test_admits_what_fits_the_deadline_and_refuses_the_rest():
    rule = Admission(timeout_s=2.0, max_queue=1000)
    assert rule.verdict(19, ROUND) is None  # 5 rounds: 1.75 s
    refusal = rule.verdict(20, ROUND)  # 6 rounds: 2.1 s
    assert refusal.status == 503 and refusal.late and "2.10 s" in refusal.reason
    assert refusal.retry_after_s == 1


def test_a_slower_machine_admits_less_where_a_fixed_queue_would_not():
    """The same queue of 16 fits 2 s at 0.35 s a round and not at 2.5 times that."""
    rule = Admission(timeout_s=2.0, max_queue=16)
    assert rule.verdict(12, ROUND) is None
    slow = Outlook(0.0, 4, 0.35 * 2.5)
    assert rule.verdict(12, slow).late
    assert rule.verdict(1, slow) is None  # two rounds still fit


def test_the_queue_bound_holds_without_prediction():
    rule = Admission(timeout_s=2.0, max_queue=8, by_prediction=False)
    assert rule.verdict(7, Outlook(0.0, 4, 10.0)) is None  # far past the deadline, but only the bound counts
    full = rule.verdict(8, ROUND)
    assert full.status == 503 and not full.late and "limit" in full.reason


def test_nothing_to_predict_with_admits_up_to_the_bound():
    rule = Admission(timeout_s=0.1, max_queue=4)
    assert rule.verdict(3, Outlook(batch=4)) is None
    assert rule.verdict(4, Outlook(batch=4)).status == 503


def test_time_waited_upstream_counts_and_a_passed_deadline_is_504():
    rule = Admission(timeout_s=2.0, max_queue=100)
    assert rule.verdict(0, ROUND, waited_s=1.5) is None
    assert rule.verdict(4, ROUND, waited_s=1.5).late  # 0.7 s no longer fits in 0.5 s
    assert rule.verdict(0, ROUND, waited_s=2.1).status == 504


def test_retry_after_is_whole_seconds_at_least_one():
    assert [retry_after(s) for s in (0.0, 0.2, 1.0, 1.01, 7.5)] == [1, 1, 1, 2, 8]


def test_served_rounds_follow_the_batches_at_their_pace():
    rounds = ServedRounds(smoothing=0.5)
    assert rounds.round_s([0.1, 0.2]) == pytest.approx(0.2)  # the plan, as predicted
    rounds.add(0.125, 1, 4, 0.2)  # a batch of 1 of a planned 4 in 125 ms: 4 at its pace in 500 ms
    assert rounds.ratio == pytest.approx(2.5)
    rounds = ServedRounds(smoothing=0.5)
    rounds.add(0.5, 4, 4, 0.2)  # first one: taken as it is
    assert rounds.ratio == pytest.approx(2.5)
    rounds.add(0.2, 4, 4, 0.2)
    assert rounds.ratio == pytest.approx(1.75)
    assert rounds.deviation == pytest.approx(0.75)  # |1.0 - 2.5| halved
    rounds.add(0.4, 8, 4, 0.2)  # twice the planned share: its share's time is half
    assert rounds.ratio == pytest.approx(1.375) and rounds.deviation == pytest.approx(0.75)
    assert rounds.round_s([0.1, 0.2]) == pytest.approx(0.2 * (1.375 + 0.75))  # the mean and a deviation


def test_served_rounds_without_a_plan_latency_use_what_was_served():
    rounds = ServedRounds()
    assert rounds.round_s([None]) is None
    rounds.add(0.3, 4, 4, None)
    assert rounds.round_s([None]) == pytest.approx(0.3)
    rounds.add(0.5, 4, 4, None)
    assert rounds.round_s([None]) == pytest.approx(0.34 + 0.04)  # 0.2 off, weighed 0.2


def test_upstream_wait_is_bounded_by_the_batch_after_which_the_queue_was_taken():
    wait = UpstreamWait(capacity=8, full=4)
    assert wait.arrived(0.0, 4) == 0.0  # nothing before: no wait known
    assert wait.arrived(1.0, 4) == pytest.approx(1.0)  # since the worker began
    # after the batch at 1.0 at most 8 - 4 were left, and the batch at 2.0 took 4: queued after 1.0
    assert wait.arrived(2.0, 4) == pytest.approx(2.0)
    assert wait.arrived(3.0, 4) == pytest.approx(2.0)
    assert wait.arrived(3.1, 2) == pytest.approx(1.1)
    # the batch of 2 at 3.1 emptied the queue: nothing now waited longer than since then
    assert wait.arrived(3.5, 4) == pytest.approx(0.4)


def test_a_look_at_the_queue_tightens_a_long_queues_bound():
    """A queue of 100 handed out in full batches of 4, each 50 ms after the last answer, bounds
    nothing for 25 batches; a look saying it held 4 (the next batch) bounds the one after next."""
    wait = UpstreamWait(capacity=100, full=4)
    for second in range(10):
        wait.arrived(float(second), 4)
        wait.answered(second + 0.95)
    assert wait.arrived(10.0, 4) == pytest.approx(10.0)  # the whole history
    wait.answered(10.19)
    wait.seen(10.2, 4)  # between batches: one may be on its way, not counted yet: one batch more is allowed
    assert wait.arrived(10.25, 4) == pytest.approx(10.25)  # the batch queued at the look
    assert wait.arrived(12.0, 4) == pytest.approx(12.0)  # may have been on its way to the worker then
    assert wait.arrived(13.0, 4) == pytest.approx(2.8)  # queued after the look


def test_the_dispatcher_counts_what_it_admits_and_refuses():
    clock = [0.0]
    dispatcher = Dispatcher(request_timeout_s=1.0, max_queue=100, clock=lambda: clock[0])
    outlook = Outlook(0.0, 2, 0.3)
    answers = [dispatcher.enqueue(Request(b"x"), outlook) for _ in range(8)]
    refused = [job.future.result() for job in answers if job.future.done()]
    assert len(dispatcher.queue) == 6 and len(refused) == 2  # 3 rounds of 0.3 s fit in 1 s, 4 do not
    assert {a.status for a in refused} == {503} and all(a.retry_after_s == 1 for a in refused)
    counts = dispatcher.counts
    assert (counts.admitted, counts.refused, counts.refused_late) == (6, 2, 2)
    late = dispatcher.enqueue(Request(b"x", waited_s=1.2), outlook)
    assert late.future.result().status == 504 and counts.expired == 1


def test_a_queued_request_that_waited_upstream_expires_sooner():
    clock = [0.0]
    dispatcher = Dispatcher(request_timeout_s=1.0, max_queue=100, clock=lambda: clock[0], admission="queue")
    job = dispatcher.enqueue(Request(b"x", waited_s=0.6))
    clock[0] = 0.5
    dispatcher.expire([])
    assert job.future.result().status == 504


def test_rounds_keep_their_pace_while_new_instances_settle():
    rounds = ServedRounds()
    rounds.add(0.4, 4, 4, 0.2, now=1.0)
    rounds.settle(until=5.0)
    rounds.add(4.0, 4, 4, 0.2, now=3.0)  # a first batch of a new instance: ten times slower, left out
    assert rounds.ratio == pytest.approx(2.0) and rounds.deviation == 0.0
    rounds.add(0.6, 4, 4, 0.2, now=6.0)
    assert rounds.ratio == pytest.approx(2.2)


def test_a_look_while_the_worker_holds_a_batch_needs_no_margin_for_one_on_its_way():
    """TorchServe's ordinary worker gets no batch while it holds one: a look then saw all that waited."""
    wait = UpstreamWait(capacity=100, full=4)
    for second in range(10):
        wait.arrived(float(second), 4)
        wait.answered(second + 0.95)
    wait.arrived(10.0, 4)
    wait.seen(10.2, 0)  # held since 10.0: nothing on its way, nothing queued
    wait.answered(10.95)
    assert wait.arrived(11.0, 4) == pytest.approx(0.8)  # came after the look
    wait.seen(11.5, 4)
    wait.answered(11.95)
    wait.seen(11.96, 0)  # between two batches: one may be on its way
    assert wait.arrived(12.0, 4) == pytest.approx(1.8)  # queued at both later looks: the one at 10.2 bounds it
    assert wait.arrived(13.0, 4) == pytest.approx(1.04)  # after the look at 11.96, with its margin


def test_a_batch_long_after_the_last_answer_found_the_queue_empty():
    """TorchServe takes a request from an empty queue as it arrives and sends its batch within its
    delay (50 ms): a batch 2 s after the last answer waited at most that, and a little slack."""
    wait = UpstreamWait(capacity=100, full=4, delay_s=0.05)
    for second in range(10):
        wait.arrived(float(second), 4)
        wait.answered(second + 0.95)
    assert wait.arrived(12.0, 4) == pytest.approx(0.15)
    wait.answered(12.5)
    assert wait.arrived(12.6, 4) == pytest.approx(12.6)  # within the delay: perhaps queued all along
