"""The environment variables of the load tests, declared once: what the locustfile sends, how the
step shape schedules users, and the request log. loadtest imports nothing of packrat, so it keeps
this registry of its own (packrat's is packrat/settings.py); packrat code and benchmarks that start
locust set these through the constants below. Kept free of locust: importing locust monkey-patches
the process.
"""
from __future__ import annotations

import os
from typing import NamedTuple


class Variable(NamedTuple):
    name: str
    type: type  # what the text is read as (read()); "" is no value
    default: str
    doc: str

    def read(self, environ=None):
        """The variable's value (unset or empty: the default) as its type."""
        return self.type((os.environ if environ is None else environ).get(self.name) or self.default)


MODEL = Variable("PACKRAT_MODEL", str, "resnet50", "the served model's name: requests go to /predictions/NAME")
BODY_FILE = Variable("PACKRAT_BODY_FILE", str, "", "the file every request sends as its body (a photo, a text, "
                                                   "a tensor...); required")
CONTENT_TYPE = Variable("PACKRAT_CONTENT_TYPE", str, "application/octet-stream", "the body's Content-Type")
REQUEST_PATH = Variable("PACKRAT_REQUEST_PATH", str, "", "the path every request is POSTed to, e.g. "
                                                     "/v2/models/NAME/infer; empty: /predictions/MODEL")
HEADER_LENGTH = Variable("PACKRAT_HEADER_LENGTH", str, "", "a KServe v2 binary body's JSON header length in bytes, "
                                                           "sent as Inference-Header-Content-Length; empty: none")
TOKEN = Variable("PACKRAT_TOKEN", str, "", "bearer token when TorchServe's token authorisation is on")
SHAPE = Variable("PACKRAT_SHAPE", str, "steady", "steady: users, spawn rate and run time from locust's command "
                                                 "line; step: packrat.loadtest.shapes.StepLoad drives the run and ends it")
STEP_USERS = Variable("PACKRAT_STEP_USERS", str, "1,8,1,8", "with step: users per step")
STEP_SECONDS = Variable("PACKRAT_STEP_SECONDS", str, "15", "with step: seconds per step, or one length per step "
                                                           "(25,20,40)")
TIMEOUT_S = Variable("PACKRAT_TIMEOUT_S", float, "60", "client-side timeout per request, in seconds")
REQUEST_LOG = Variable("PACKRAT_REQUEST_LOG", str, "", "a file to append one line per request to "
                                                       "(packrat.loadtest.requestlog)")
RATE = Variable("PACKRAT_RATE", float, "0", "open loop: the requests per second the users send together, each "
                                            "paced at RATE / users from a random start (with steady only); 0: "
                                            "closed loop, each user's next request as soon as its answer arrives")
RETRY_AFTER = Variable("PACKRAT_RETRY_AFTER", float, "0", "closed loop: after a 503 with a Retry-After header, "
                                                          "a user waits that many seconds, at most this many, "
                                                          "before its next request; 0: it sends again at once")
VARIABLES = (MODEL, BODY_FILE, CONTENT_TYPE, REQUEST_PATH, HEADER_LENGTH, TOKEN, SHAPE, STEP_USERS, STEP_SECONDS,
             TIMEOUT_S, REQUEST_LOG, RATE, RETRY_AFTER)
