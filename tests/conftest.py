"""The suite writes nothing outside temporary directories: caches that default to the user's home
(compiled AOTInductor packages, matplotlib's font cache, the latencies engines served) point at one temporary directory for the
whole session, set in the environment before any test runs, so that every process the tests start
(profile points, pool instances, TorchServe workers, Ray replicas) inherits it. One session cache
also means each compiled package (say the tiny model at ⟨2 threads, batch 2⟩) is built once."""

import os
import shutil
import tempfile

from packrat.settings import COMPILE_CACHE_ENV, NODE_DIR_ENV, SERVED_DIR_ENV

# The node directory too: the engines a test starts plan their cores together, not with a server
# the user runs beside the suite.
_CACHES = {COMPILE_CACHE_ENV.name: "compiled", "MPLCONFIGDIR": "matplotlib", NODE_DIR_ENV.name: "node",
           SERVED_DIR_ENV.name: "served"}
_session_dir = None


def pytest_configure(config):
    global _session_dir
    _session_dir = tempfile.mkdtemp(prefix="packrat-tests-")
    for env, name in _CACHES.items():
        os.environ[env] = os.path.join(_session_dir, name)


def pytest_unconfigure(config):
    if _session_dir:
        shutil.rmtree(_session_dir, ignore_errors=True)
