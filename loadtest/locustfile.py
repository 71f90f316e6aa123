"""Locust users that POST one model sample per request to TorchServe's /predictions/{model}.

Configured by the environment: the model, the body and its type, a token, the load's shape, the
client's timeout and a request log (loadtest/env.py lists them with their defaults).

Any answer but 200 counts as a failure. Latencies go into a 3-significant-digit histogram;
the per-second history (--csv-full-history) gets percentiles over about the last second.
"""
from __future__ import annotations

import gevent
import locust.stats
from locust import FastHttpUser, constant, task

from packrat.loadtest import env
from packrat.loadtest.histogram import bucket_ms
from packrat.loadtest.requestlog import RequestRecord, format_record

MODEL = env.MODEL.read()
TOKEN = env.TOKEN.read()
SHAPE = env.SHAPE.read()
# A dead or wedged server must fail requests, not hang the run.
TIMEOUT_S = env.TIMEOUT_S.read()

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

# Read once: per-request work would load the client, not the server.
if not env.BODY_FILE.read():
    raise ValueError(f"set {env.BODY_FILE.name} to the file each request sends (and {env.CONTENT_TYPE.name} to "
                     f"its type)")
with open(env.BODY_FILE.read(), "rb") as _body:
    BODY = _body.read()
HEADERS = {"Content-Type": env.CONTENT_TYPE.read()}
if TOKEN:
    HEADERS["Authorization"] = f"Bearer {TOKEN}"
PATH = f"/predictions/{MODEL}"

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
                                                       reason)))

# Locust arms its --run-time timer on gevent's cached loop clock, which stood still while this
# file imported locust and read the body: without a refresh, runs end that much too early.
gevent.get_hub().loop.update_now()


class ModelUser(FastHttpUser):
    wait_time = constant(0)  # closed loop: the next request as soon as the answer arrives
    network_timeout = TIMEOUT_S
    connection_timeout = TIMEOUT_S

    @task
    def predict(self) -> None:
        with self.client.post(PATH, data=BODY, headers=HEADERS, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}")
