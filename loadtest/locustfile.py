"""Locust users that POST one model sample per request to TorchServe's /predictions/{model} (or
another path: a KServe v2 infer route, its binary body's header length in a header of its own).

Configured by the environment: the model, the body and its type, the path and header length, a
token, the load's shape, the client's timeout, a request log and an open-loop rate (loadtest/env.py
lists them with their defaults).

Closed loop by default: each user sends its next request as soon as its answer arrives. With a rate
(env.RATE), open loop: the users together send RATE requests per second whatever the answers
take, each at locust's constant_throughput(RATE / users) from a random start within its first
period (all starting at once would send a burst of every user's first request), so that arrivals
are spread evenly; a user whose answer takes longer than its period sends the next one at once.
Enough users keep the pace while answers take up to the server's deadline (packrat bench
overload runs RATE × (deadline + 1 s)).

Closed loop with env.RETRY_AFTER set, a user answered 503 with a Retry-After header waits that long
(at most RETRY_AFTER seconds) before its next request, as a client that honours it would; open-loop
users keep their pace whatever the answers say.

Any answer but 200 counts as a failure. Latencies go into a 3-significant-digit histogram;
the per-second history (--csv-full-history) gets percentiles over about the last second. The
request log (env.REQUEST_LOG) classes each client error (no whole HTTP answer) by what
geventhttpclient raised: reset, refused, timeout or other (requestlog.error_class).
"""
from __future__ import annotations

import random
import time

import gevent
import locust.stats
from locust import FastHttpUser, task
from locust.contrib.fasthttp import LocustBadStatusCode
from locust.exception import CatchResponseError

from packrat.loadtest import env
from packrat.loadtest.histogram import bucket_ms
from packrat.loadtest.requestlog import RequestRecord, error_class, format_record

MODEL = env.MODEL.read()
TOKEN = env.TOKEN.read()
SHAPE = env.SHAPE.read()
# A dead or wedged server must fail requests, not hang the run.
TIMEOUT_S = env.TIMEOUT_S.read()
RATE = env.RATE.read()  # requests per second of all users together; 0: closed loop
RETRY_AFTER = env.RETRY_AFTER.read()  # closed loop: the longest wait a 503's Retry-After earns; 0: none

# Locust's documented hook for custom bucketing; its default is too coarse (see bucket_ms).
locust.stats.bucket_response_time = bucket_ms
# The per-second history's percentiles cover the last ~(window - 1) s: locust's 10 s would smear
# a step's latency change over the next ten rows; 2 gives about the last second.
locust.stats.CURRENT_RESPONSE_TIME_PERCENTILE_WINDOW = 2

if SHAPE == "step":
    # Locust runs any LoadTestShape subclass it finds in this module, hence the conditional import.
    from packrat.loadtest.shapes import StepLoad  # noqa: F401
elif SHAPE != "steady":
    raise ValueError(f"{env.SHAPE.name} must be steady or step, got {SHAPE!r}")
if RATE < 0 or (RATE and SHAPE != "steady"):
    raise ValueError(f"{env.RATE.name} must be >= 0, and is for the steady shape only; got {RATE} with {SHAPE}")
if RETRY_AFTER < 0:
    raise ValueError(f"{env.RETRY_AFTER.name} must be >= 0, got {RETRY_AFTER}")

# Read once: per-request work would load the client, not the server.
if not env.BODY_FILE.read():
    raise ValueError(f"set {env.BODY_FILE.name} to the file each request sends (and {env.CONTENT_TYPE.name} to "
                     f"its type)")
with open(env.BODY_FILE.read(), "rb") as _body:
    BODY = _body.read()
HEADERS = {"Content-Type": env.CONTENT_TYPE.read()}
if TOKEN:
    HEADERS["Authorization"] = f"Bearer {TOKEN}"
if env.HEADER_LENGTH.read():  # the KServe v2 binary extension: where the body's JSON header ends
    HEADERS["Inference-Header-Content-Length"] = env.HEADER_LENGTH.read()
PATH = env.REQUEST_PATH.read() or f"/predictions/{MODEL}"


def client_error(response, exception) -> str:
    """The class of the request's client error ("" when a whole HTTP answer came): for no answer,
    what the transport raised (geventhttpclient's, kept on the response); for an answer whose body
    was cut, the read's error. An answer's own status is no client error."""
    if exception is None:
        return ""
    if getattr(response, "status_code", 0):
        return "" if isinstance(exception, (CatchResponseError, LocustBadStatusCode)) else error_class(exception)
    return error_class(getattr(response, "error", None) or exception)


REQUEST_LOG = env.REQUEST_LOG.read()
if REQUEST_LOG:
    _request_log = open(REQUEST_LOG, "a", buffering=1)  # a line each: readable while the run goes on

    @locust.events.request.add_listener
    def _log_request(start_time, response_time, response, exception, **_) -> None:
        status = getattr(response, "status_code", 0) or 0
        reason = ""
        if exception is not None:
            try:
                reason = response.text or ""
            except Exception:  # no body to read: refused, reset or timed out
                reason = ""
            reason = reason or str(getattr(response, "error", None) or exception)
        _request_log.write(format_record(RequestRecord(start_time, response_time, status, exception is not None,
                                                       reason, client_error(response, exception))))

# Locust arms its --run-time timer on gevent's cached loop clock, which stood still while this
# file imported locust and read the body: without a refresh, runs end that much too early.
gevent.get_hub().loop.update_now()


def retry_after_s(value) -> float:
    """A Retry-After header's seconds (a number; a date or nothing: 0), within RETRY_AFTER."""
    try:
        return min(max(float(value), 0.0), RETRY_AFTER)
    except (TypeError, ValueError):
        return 0.0


def closed(user: "ModelUser") -> float:
    """Closed loop's wait: none, or the pause a 503's Retry-After asked for (once)."""
    pause, user.pause_s = user.pause_s, 0.0
    return pause


def paced(user: "ModelUser") -> float:
    """Open loop's wait: locust's constant_throughput(RATE / users), kept from the user's own random
    start (locust's keeps it from the user's creation, which would undo the start's spread): the
    next request one period after the last was sent, or at once when its answer came later."""
    now = time.perf_counter()
    user.next_send = max(user.next_send + user.period_s, now)
    return user.next_send - now


class ModelUser(FastHttpUser):
    wait_time = closed if not RATE else paced  # closed loop: the next request as soon as the answer arrives
    pause_s = 0.0  # closed loop: the wait a 503's Retry-After asked for
    network_timeout = TIMEOUT_S
    connection_timeout = TIMEOUT_S

    def on_start(self) -> None:
        if RATE:  # open loop: this user's first request at a random point of its first period
            users = self.environment.parsed_options.num_users
            self.period_s = users / RATE
            self.next_send = time.perf_counter() + random.uniform(0.0, self.period_s)
            gevent.sleep(self.next_send - time.perf_counter())

    @task
    def predict(self) -> None:
        with self.client.post(PATH, data=BODY, headers=HEADERS, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}")
            if response.status_code == 503 and RETRY_AFTER and not RATE:
                self.pause_s = retry_after_s((response.headers or {}).get("Retry-After"))
