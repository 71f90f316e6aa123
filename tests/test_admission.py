"""Admission by prediction (packrat/serving/pool/admission.py): plain numbers, no processes."""

import pytest

from packrat.serving.pool.admission import (
    CAUSES,
    RATIO_BOUNDS,
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
    rule = Admission(timeout_s=2.0, max_queue=1000, swing=1.0, jitter=lambda: 0.0)
    assert rule.verdict(19, ROUND) is None  # 5 rounds: 1.75 s
    refusal = rule.verdict(20, ROUND)  # 6 rounds: 2.1 s
    assert refusal.status == 503 and refusal.late and "2.10 s" in refusal.reason
    assert refusal.retry_after_s == 1


def test_what_fits_only_at_the_predicted_pace_is_refused():
    """The prediction must hold a third slower (SWING): 5 rounds of 0.35 s fit 2 s at the predicted
    pace, but not at a slower one, which under overload comes in bursts and sinks a whole queue."""
    assert Admission(timeout_s=2.0, max_queue=1000, swing=1.0).verdict(19, ROUND) is None
    refusal = Admission(timeout_s=2.0, max_queue=1000, jitter=lambda: 0.0).verdict(19, ROUND)
    assert refusal.late and "1.75 s (2.33 s at a 1.33x slower pace), past its 2.00 s left" in refusal.reason
    assert Admission(timeout_s=2.0, max_queue=1000).verdict(15, ROUND) is None  # 4 rounds: 1.40 s, 1.87 s slower


def test_a_slower_machine_admits_less_where_a_fixed_queue_would_not():
    """The same queue of 16 fits 2 s at 0.35 s a round and not at 2.5 times that."""
    rule = Admission(timeout_s=2.0, max_queue=16, swing=1.0)
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
    rule = Admission(timeout_s=2.0, max_queue=100, swing=1.0)
    assert rule.verdict(0, ROUND, waited_s=1.5) is None
    assert rule.verdict(4, ROUND, waited_s=1.5).late  # 0.7 s no longer fits in 0.5 s
    assert rule.verdict(0, ROUND, waited_s=2.1).status == 504


def test_retry_after_is_whole_seconds_at_least_one():
    assert [retry_after(s) for s in (0.0, 0.2, 1.0, 1.01, 7.5)] == [1, 1, 1, 2, 8]


@pytest.mark.parametrize("excess, jitter, expected", [
    (0.0, 0.0, 1), (0.0, 0.99, 1),  # nothing to drain: a second
    (0.2, 0.0, 1), (0.2, 0.5, 1), (0.2, 0.9, 2),  # a short drain: spread over a second more
    (4.0, 0.0, 4), (4.0, 0.3, 5), (4.0, 0.99, 6),  # a long one: over half of it more
    (10.0, 0.99, 15),
])
def test_retry_after_spreads_refused_clients_over_half_the_drain_more(excess, jitter, expected):
    assert retry_after(excess, jitter) == expected


def test_refusals_at_once_get_spread_retry_afters():
    import random

    rule = Admission(timeout_s=1.0, max_queue=1000, swing=1.0, jitter=random.Random(7).random)
    seen = [rule.verdict(18, Outlook(0.0, 4, 0.5)).retry_after_s for _ in range(200)]  # 2.5 s: 1.5 s past it
    assert min(seen) == 2 and max(seen) == 3 and 0.3 < seen.count(3) / len(seen) < 0.7


def test_served_rounds_follow_the_batches_at_their_pace():
    rounds = ServedRounds(smoothing=0.5)
    assert rounds.round_s([0.1, 0.2]) == pytest.approx(0.2)  # the plan, as predicted
    rounds.add(0.125, 1, 4, 0.2)  # a batch of 1 of a planned 4 in 125 ms: counted twice, 250 ms, not 500
    assert rounds.ratio == pytest.approx(1.125) and rounds.deviation == pytest.approx(0.125)
    rounds = ServedRounds(smoothing=0.5)
    rounds.add(0.5, 4, 4, 0.2)  # the first one too is mixed in, from the plan's 1.0
    assert rounds.ratio == pytest.approx(1.75) and rounds.deviation == pytest.approx(0.75)
    rounds.add(0.2, 4, 4, 0.2)
    assert rounds.ratio == pytest.approx(1.375) and rounds.deviation == pytest.approx(0.75)
    rounds.add(0.4, 8, 4, 0.2)  # twice the planned share: its share's time is half
    assert rounds.ratio == pytest.approx(1.1875) and rounds.deviation == pytest.approx(0.5625)
    assert rounds.round_s([0.1, 0.2]) == pytest.approx(0.2 * (1.1875 + 0.5625))  # the mean and a deviation


@pytest.mark.parametrize("measured, requests, sample", [
    (0.1, 4, 1.0),  # the planned batch at the plan's pace
    (0.1, 2, 2.0),  # half a batch in a whole batch's time: twice its own time
    (0.05, 1, 1.0),  # a batch of one in half the time: twice, not four times
    (0.3, 1, 4.0),  # ... and the step bound: at most 4× the ratio it joins
    (0.3, 12, 1.0),  # three batches' worth in three batches' time
    (0.3, 8, 1.5),
    (0.01, 4, 0.1),  # ten times faster
    (0.001, 4, 0.05),  # a hundred times: the ratio's lower bound
])
def test_a_sample_is_the_planned_share_against_the_plan_bounded(measured, requests, sample):
    rounds = ServedRounds(smoothing=1.0)  # the ratio is the last sample
    rounds.add(measured, requests, 4, 0.1)
    assert rounds.ratio == pytest.approx(sample)


def test_the_ratio_stays_within_its_bounds():
    slow, fast = ServedRounds(), ServedRounds()
    for _ in range(200):
        slow.add(100.0, 4, 4, 0.1)  # 1000× the plan
        fast.add(1e-6, 4, 4, 0.1)
    assert slow.ratio == pytest.approx(RATIO_BOUNDS[1]) and slow.margin_ratio == pytest.approx(RATIO_BOUNDS[1])
    assert fast.ratio == pytest.approx(RATIO_BOUNDS[0])


def test_served_rounds_without_a_plan_latency_use_what_was_served():
    rounds = ServedRounds()
    assert rounds.round_s([None]) is None
    rounds.add(0.3, 4, 4, None)  # the first planned share served: what such an instance is expected to take
    assert rounds.reference_s == pytest.approx(0.3) and rounds.ratio == 1.0
    assert rounds.round_s([None]) == pytest.approx(0.3)
    rounds.add(0.5, 4, 4, None)  # 5/3 of it: a ratio, as any instance's
    assert rounds.ratio == pytest.approx(0.8 + 0.2 * 5 / 3)
    assert rounds.round_s([None]) == pytest.approx(0.3 * (rounds.ratio + rounds.deviation))


def test_a_pool_of_planned_and_unplanned_instances_keeps_one_unit():
    """One instance plans 200 ms, one has no plan latency: both are ratios of what each is expected
    to take, so neither's seconds end up in the other's prediction."""
    rounds = ServedRounds()
    assert rounds.round_s([0.2, None]) == pytest.approx(0.2)  # the unplanned one not served yet: the plan's
    rounds.add(0.2, 4, 4, 0.2)
    rounds.add(0.05, 4, 4, None)  # sets its expected time: 50 ms, a ratio of 1
    for _ in range(5):
        rounds.add(0.2, 4, 4, 0.2)
        rounds.add(0.05, 4, 4, None)
    assert rounds.ratio == pytest.approx(1.0) and rounds.round_s([0.2, None]) == pytest.approx(0.2)
    rounds.add(0.4, 4, 4, 0.2)  # the planned one at twice its pace
    assert rounds.ratio == pytest.approx(1.2) and rounds.round_s([0.2, None]) == pytest.approx(0.2 * 1.4)


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
    dispatcher = Dispatcher(request_timeout_s=1.0, max_queue=100, clock=lambda: clock[0], jitter=lambda: 0.0, swing=1.0)
    outlook = Outlook(0.0, 2, 0.3)
    answers = [dispatcher.enqueue(Request(b"x"), outlook) for _ in range(8)]
    refused = [job.future.result() for job in answers if job.future.done()]
    assert len(dispatcher.queue) == 6 and len(refused) == 2  # 3 rounds of 0.3 s fit in 1 s, 4 do not
    assert {a.status for a in refused} == {503} and all(a.retry_after_s == 1 for a in refused)
    counts = dispatcher.counts
    assert (counts.admitted, counts.refused, counts.refused_late) == (6, 2, 2)
    late = dispatcher.enqueue(Request(b"x", received_at=-1.2), outlook)
    assert late.future.result().status == 504 and counts.expired == 1


def test_a_queued_request_that_waited_upstream_expires_sooner():
    clock = [0.0]
    dispatcher = Dispatcher(request_timeout_s=1.0, max_queue=100, clock=lambda: clock[0], admission="queue")
    job = dispatcher.enqueue(Request(b"x", received_at=-0.6))
    clock[0] = 0.5
    dispatcher.expire([])
    assert job.future.result().status == 504


def test_rounds_keep_their_pace_while_new_instances_settle():
    rounds = ServedRounds()
    rounds.add(0.4, 4, 4, 0.2, now=1.0)
    rounds.settle(until=5.0)
    rounds.add(4.0, 4, 4, 0.2, now=3.0)  # a first batch of a new instance: ten times slower, left out
    assert rounds.ratio == pytest.approx(1.2) and rounds.deviation == pytest.approx(0.2)
    rounds.add(0.6, 4, 4, 0.2, now=6.0)
    assert rounds.ratio == pytest.approx(1.56)


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


def test_a_batch_sent_long_after_the_last_answer_found_the_queue_empty():
    """TorchServe takes a request from an empty queue as it arrives and sends its batch within its
    delay (50 ms): a batch sent 2 s after the last answer waited at most that, a little slack, and
    the time TorchServe's Python side took to hand it over."""
    wait = UpstreamWait(capacity=100, full=4, delay_s=0.05)
    for second in range(10):
        wait.arrived(float(second), 4, sent_at=float(second))
        wait.answered(second + 0.95)
    assert wait.arrived(12.0, 4, sent_at=11.9) == pytest.approx(0.25)
    wait.answered(12.5)
    assert wait.arrived(12.6, 4, sent_at=12.52) == pytest.approx(12.6)  # sent within the delay: perhaps queued all along


def test_a_batch_whose_bodies_took_long_to_hand_over_is_not_taken_for_an_idle_queue():
    """JSON bodies: TorchServe's Python side decodes each (0.2 s for 3 MB here) before the handler
    sees the batch. A batch sent 10 ms after the last answer from a full queue reached the handler
    0.9 s later: its requests waited the queue's rounds, not the 0.15 s the old rule read in the
    gap (they were admitted, and answered 200 or 504 past their deadlines); nor does a gap with
    no known send time say the queue was empty."""
    wait = UpstreamWait(capacity=100, full=4, delay_s=0.05)
    for second in range(10):
        wait.arrived(second + 0.9, 4, sent_at=float(second))
        wait.answered(second + 0.95)
    assert wait.arrived(10.86, 4, sent_at=9.96) == pytest.approx(10.86)
    wait.answered(10.9)
    assert wait.arrived(12.0, 4) == pytest.approx(12.0)
    wait.answered(12.1)
    assert wait.arrived(13.0, 4, sent_at=11.0) == pytest.approx(13.0)  # an older message's time: not this batch's


def test_bounds_count_from_when_torchserve_sent_the_batches():
    """The batches taken before bound a wait from when TorchServe took them, not from when their
    bodies were decoded and the handler saw them: what stayed in the queue was there since."""
    wait = UpstreamWait(capacity=8, full=4)
    wait.arrived(1.0, 4, sent_at=0.2)
    wait.answered(1.1)
    wait.arrived(2.0, 4, sent_at=1.15)
    wait.answered(2.1)
    assert wait.arrived(3.0, 4, sent_at=2.15) == pytest.approx(2.8)  # the queue left at 0.2 was taken by then


PLAN_S, PLAN_B = 0.1, 4  # one instance planning 4 requests in 100 ms


def burst(rounds: ServedRounds, rule: Admission, now: float, arriving: int = 8) -> tuple[int, float]:
    """`arriving` requests reach the idle pool at `now` one after another; those admitted are served
    at the plan's pace in sub-batches of up to its batch (half of a batch's time is fixed cost).
    How many were admitted, and when the last was answered."""
    admitted = 0
    for _ in range(arriving):
        outlook = rounds.outlook(now, [(PLAN_S, PLAN_B, None)], idle=admitted == 0)
        admitted += rule.verdict(admitted, outlook) is None
    left = admitted
    while left:
        size = min(PLAN_B, left)
        took = PLAN_S * (0.5 + 0.5 * size / PLAN_B)
        now += took
        rounds.add(took, size, PLAN_B, PLAN_S, now)
        left -= size
    return admitted, now


def test_a_ratio_poisoned_by_one_slow_sub_batch_admits_again_within_a_few_rounds():
    """One sub-batch 20× slower than the plan (a stall, a neighbour's burst) must not shut the pool:
    it moves the ratio a bounded step, the pool keeps admitting, and what it serves brings the ratio
    back, so within a few rounds it admits what it did before."""
    rule, rounds, now = Admission(timeout_s=0.3, max_queue=100, swing=1.0), ServedRounds(), 0.0
    for _ in range(20):
        admitted, now = burst(rounds, rule, now)
    assert admitted == 8  # two rounds of 100 ms fit 300 ms
    now += 2.0
    rounds.add(2.0, PLAN_B, PLAN_B, PLAN_S, now)  # the poison
    seen = []
    for _ in range(6):
        admitted, now = burst(rounds, rule, now + 1.0)
        seen.append(admitted)
    assert seen[0] >= 1 and 8 in seen, seen
    assert rounds.ratio < 1.5


def test_an_idle_pool_whose_ratio_predicts_a_miss_admits_a_probe_and_recovers():
    """A ratio 20× the plan (the machine was slow for a while) predicts a miss even for one request
    at an idle pool: refusing it would serve no batch and leave the ratio as it is for ever. A
    request reaching an idle pool is admitted whatever the prediction (a probe); what it is served
    in brings the ratio down, until whole batches are admitted again."""
    rule, rounds, now = Admission(timeout_s=0.5, max_queue=100, swing=1.0), ServedRounds(), 0.0
    for _ in range(100):
        now += 2.0
        rounds.add(2.0, PLAN_B, PLAN_B, PLAN_S, now)
    assert rounds.margin_ratio == pytest.approx(20.0)
    idle = rounds.outlook(now, [(PLAN_S, PLAN_B, None)], idle=True)
    assert answer_in_s(0, 0.0, idle.batch, idle.round_s) > 0.5  # the prediction misses...
    assert rule.verdict(0, idle) is None  # ...and the probe is admitted all the same
    assert rule.verdict(0, rounds.outlook(now, [(PLAN_S, PLAN_B, now)], idle=False)).late  # not beside a batch
    seen = []
    for _ in range(20):  # a request 50 ms after each answer, as a loaded server's clients bring them
        admitted, now = burst(rounds, rule, now + 0.05)
        seen.append(admitted)
    assert seen[0] == 1 and max(seen) >= PLAN_B, seen


def test_an_idle_pools_ratio_decays_towards_the_plan():
    rounds, now = ServedRounds(), 0.0
    for _ in range(100):
        now += 2.0
        rounds.add(2.0, PLAN_B, PLAN_B, PLAN_S, now)
    busy = rounds.outlook(now + 30.0, [(PLAN_S, PLAN_B, now)], idle=False)
    assert rounds.ratio == pytest.approx(20.0) and busy.round_s == pytest.approx(2.0)  # running: no decay
    rounds.outlook(now + 40.0, [(PLAN_S, PLAN_B, None)], idle=True)  # idle 10 s since: one half-life
    assert rounds.ratio == pytest.approx(1 + 19 / 2)
    idle = rounds.outlook(now + 100.0, [(PLAN_S, PLAN_B, None)], idle=True)  # a minute later
    assert idle.round_s == pytest.approx(PLAN_S * (1 + 19 / 2 ** 7), rel=1e-3)


def test_a_requests_time_counts_from_its_receipt():
    """A request received 0.8 s before it reaches the pool (its body read, parsed, waiting for the
    GIL) has 0.2 s of a 1 s deadline left: a 0.3 s round no longer fits, and queued, it expires
    1 s after its receipt, not after it was queued."""
    clock = [10.0]
    dispatcher = Dispatcher(request_timeout_s=1.0, max_queue=100, clock=lambda: clock[0], jitter=lambda: 0.0, swing=1.0)
    outlook = Outlook(0.0, 2, 0.3)
    assert dispatcher.refusal(outlook, received_at=9.2).status == 503  # the early check, before the body
    assert dispatcher.refusal(outlook, received_at=10.0) is None
    late = dispatcher.enqueue(Request(b"x", received_at=9.2), outlook)
    assert "past its 0.20 s left" in late.future.result().reason
    fits = dispatcher.enqueue(Request(b"x", received_at=9.6), Outlook(0.0, 2, 0.1))
    assert fits.deadline == pytest.approx(10.6)
    clock[0] = 10.6
    dispatcher.expire([])
    assert fits.future.result().status == 504


def test_the_clients_deadline_wins_where_it_is_tighter():
    clock = [0.0]
    dispatcher = Dispatcher(request_timeout_s=1.0, max_queue=100, clock=lambda: clock[0], jitter=lambda: 0.0, swing=1.0)
    outlook = Outlook(0.0, 2, 0.3)
    tight = dispatcher.enqueue(Request(b"x", received_at=0.0, timeout_s=0.2), outlook)
    assert tight.future.result().status == 503  # 0.3 s does not fit its 0.2 s
    loose = dispatcher.enqueue(Request(b"x", received_at=0.0, timeout_s=5.0), outlook)
    assert loose.deadline == 1.0  # the server's, tighter
    clients = dispatcher.enqueue(Request(b"x", received_at=0.0, timeout_s=0.5), outlook)
    assert clients.deadline == 0.5
    clock[0] = 0.5
    dispatcher.expire([])
    assert clients.future.result().status == 504 and "0.5 s" in clients.future.result().reason
    assert not loose.future.done()
    assert Admission(1.0, 100, swing=1.0).verdict(0, Outlook(0.0, 2, 0.3), 0.0, client_timeout_s=0.1).late


def test_refusals_are_counted_by_cause():
    clock = [0.0]
    dispatcher = Dispatcher(request_timeout_s=1.0, max_queue=4, clock=lambda: clock[0], jitter=lambda: 0.0, swing=1.0)
    for _ in range(5):
        dispatcher.enqueue(Request(b"x"), Outlook(0.0, 1, 0.3))  # 3 fit; the fourth and fifth are late
    for _ in range(2):
        dispatcher.enqueue(Request(b"x"), Outlook(0.0, 4, 0.1))  # one fits; then the queue is full
    dispatcher.enqueue(Request(b"x", received_at=-2.0), Outlook(0.0, 4, 0.1))  # its deadline passed upstream
    dispatcher.unavailable("no instance is ready")
    dispatcher.refuse_queued("the model is being unloaded")  # the 4 admitted
    counts = dispatcher.counts
    assert dict(counts.refusals) == {"late": 2, "queue_full": 1, "expired_before": 1, "unavailable": 5}
    assert set(counts.refusals) <= set(CAUSES)
    assert (counts.admitted, counts.refused, counts.refused_late, counts.expired) == (4, 8, 2, 1)


def test_the_queue_torchserve_should_hold_follows_the_served_cycle():
    """Full batches every 0.6 s (JSON bodies: 12x the profile's pace): at a 2 s deadline the queue
    that answers its last request in time holds one batch, whatever the archive sized it for."""
    wait = UpstreamWait(capacity=164, full=4)
    assert wait.fitting(2.0, 1000) is None  # nothing served yet
    wait.arrived(0.1, 2, sent_at=0.0)  # a partial batch: the queue was empty, no cycle ends or starts here
    wait.answered(0.5)
    for k in range(1, 10):
        wait.arrived(k * 0.6 + 0.5, 4, sent_at=k * 0.6)
        wait.answered(k * 0.6 + 0.58)
    assert wait.cycle_s() == pytest.approx(0.6)
    assert wait.fitting(2.0, 1000) == 4  # 2 / (0.6 x 4/3) = 2.5 rounds: one queued beyond the running one
    assert wait.fitting(10.0, 1000) == 4 * 11
