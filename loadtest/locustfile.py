"""Locust users that POST one model sample per request to TorchServe's /predictions/{model}.

Environment:
  PACKRAT_MODEL         the served model's name: requests go to /predictions/{PACKRAT_MODEL} (default resnet50)
  PACKRAT_BODY_FILE     the file every request sends as its body (a photo, a text, a tensor...)
  PACKRAT_CONTENT_TYPE  its Content-Type (default application/octet-stream)
  PACKRAT_TOKEN         bearer token when TorchServe's token authorisation is on (optional)
  PACKRAT_SHAPE         steady (default): users, spawn rate and run time from the command line;
                        step: loadtest.shapes.StepLoad drives the run and ends it
  PACKRAT_STEP_USERS    with step: users per step, e.g. "1,8,1,8"
  PACKRAT_STEP_SECONDS  with step: seconds per step, e.g. 15, or one length per step, e.g. 25,20,40
  PACKRAT_TIMEOUT_S     client-side timeout per request in seconds (default 60)
  PACKRAT_REQUEST_LOG   a file to append one line per request to (loadtest.requestlog; optional)

Any answer but 200 counts as a failure. Latencies go into a 3-significant-digit histogram;
the per-second history (--csv-full-history) gets percentiles over about the last second.
"""
from __future__ import annotations

import os

import gevent
import locust.stats
from locust import FastHttpUser, constant, task

from loadtest.histogram import bucket_ms
from loadtest.requestlog import RequestRecord, format_record

MODEL = os.environ.get("PACKRAT_MODEL", "resnet50")
TOKEN = os.environ.get("PACKRAT_TOKEN", "")
SHAPE = os.environ.get("PACKRAT_SHAPE", "steady")
# A dead or wedged server must fail requests, not hang the run.
TIMEOUT_S = float(os.environ.get("PACKRAT_TIMEOUT_S", "60"))

# Locust's documented hook for custom bucketing; its default is too coarse (see bucket_ms).
locust.stats.bucket_response_time = bucket_ms
# The per-second history's percentiles cover the last ~(window - 1) s: locust's 10 s would smear
# a step's latency change over the next ten rows; 2 gives about the last second.
locust.stats.CURRENT_RESPONSE_TIME_PERCENTILE_WINDOW = 2

if SHAPE == "step":
    # Locust runs any LoadTestShape subclass it finds in this module, hence the conditional import.
    from loadtest.shapes import StepLoad  # noqa: F401
elif SHAPE != "steady":
    raise ValueError(f"PACKRAT_SHAPE must be steady or step, got {SHAPE!r}")

# Read once: per-request work would load the client, not the server.
if not os.environ.get("PACKRAT_BODY_FILE"):
    raise ValueError("set PACKRAT_BODY_FILE to the file each request sends (and PACKRAT_CONTENT_TYPE to its type)")
with open(os.environ["PACKRAT_BODY_FILE"], "rb") as _body:
    BODY = _body.read()
HEADERS = {"Content-Type": os.environ.get("PACKRAT_CONTENT_TYPE") or "application/octet-stream"}
if TOKEN:
    HEADERS["Authorization"] = f"Bearer {TOKEN}"
PATH = f"/predictions/{MODEL}"

REQUEST_LOG = os.environ.get("PACKRAT_REQUEST_LOG", "")
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
