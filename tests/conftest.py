"""The suite writes nothing outside temporary directories: caches that default to the user's home
(compiled AOTInductor packages, matplotlib's font cache, the latencies engines served) point at one temporary directory for the
whole session, set in the environment before any test runs, so that every process the tests start
(profile points, pool instances, TorchServe workers, Ray replicas) inherits it. One session cache
also means each compiled package (say the tiny model at ⟨2 threads, batch 2⟩) is built once.

`scripts/test.sh` runs the suite in two pytest runs, the `serial` tests alone, then the others on
two pytest-xdist workers; it makes the directory, hands it to both runs in TESTS_SESSION_DIR
and removes it after them; xdist's workers inherit it from their controller. The compile cache and
matplotlib's cache are shared, safely: a package is built under a file lock and written whole
(packrat/models/compiled.py), and matplotlib locks its font cache. The node and served directories
are each worker's own: two workers' engines are two tests, not one node planning its cores together."""

import os
import shutil
import tempfile

from packrat.settings import COMPILE_CACHE_ENV, NODE_DIR_ENV, SERVED_DIR_ENV

SESSION_ENV = "TESTS_SESSION_DIR"
# Shared by every worker of a run: built under locks, written whole.
_SHARED = {COMPILE_CACHE_ENV.name: "compiled", "MPLCONFIGDIR": "matplotlib"}
# Each worker's own. The node directory too: the engines a test starts plan their cores together,
# not with a server the user runs beside the suite, nor with another worker's test.
_OWN = {NODE_DIR_ENV.name: "node", SERVED_DIR_ENV.name: "served"}
_session_dir = None  # made here, removed at the end; None where a caller made it (and removes it)


def pytest_configure(config):
    global _session_dir
    given = os.environ.get(SESSION_ENV)
    if given and os.path.isdir(given):
        root = given
    else:
        root = _session_dir = tempfile.mkdtemp(prefix="packrat-tests-")
        os.environ[SESSION_ENV] = root  # xdist's workers start after this and inherit it
    own = os.path.join(root, os.environ.get("PYTEST_XDIST_WORKER", "main"))
    for env, name in _SHARED.items():
        os.environ[env] = os.path.join(root, name)
    for env, name in _OWN.items():
        os.environ[env] = os.path.join(own, name)


def pytest_unconfigure(config):
    if _session_dir:
        shutil.rmtree(_session_dir, ignore_errors=True)
        os.environ.pop(SESSION_ENV, None)
