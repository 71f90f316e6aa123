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
CACHE_ENV = "TESTS_COMPILE_CACHE"  # a compile cache in TMPDIR that outlives the run, keyed by the code that builds
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
    if os.environ.get(CACHE_ENV):  # packages and conversions kept between runs (scripts/test.sh)
        os.environ[COMPILE_CACHE_ENV.name] = os.environ[CACHE_ENV]
    for env, name in _OWN.items():
        os.environ[env] = os.path.join(own, name)


# The modules that take longest (docs/testing.md's slowest), started first: on --dist loadfile a
# module is one worker's, and one started last is the run's tail (the device suite's 134-195 s).
LONGEST_FIRST = ("test_device_suite.py", "test_bench_overload.py", "test_pool.py", "test_ray_serve.py",
                 "test_models.py", "test_fuzz_servers.py", "test_hf.py", "test_ios_runtime.py", "test_peers.py",
                 "test_measuring.py", "test_ios_search.py", "test_models_ios.py")


def pytest_collection_modifyitems(config, items):
    """The longest modules first, then the modules with integration or slow tests, then the rest;
    collection order within each."""
    heavy = {item.path for item in items if item.get_closest_marker("integration") or item.get_closest_marker("slow")}

    def rank(item) -> tuple[int, int]:
        name = item.path.name
        return (0, LONGEST_FIRST.index(name)) if name in LONGEST_FIRST else (1 if item.path in heavy else 2, 0)

    items.sort(key=rank)


def pytest_unconfigure(config):
    if _session_dir:
        shutil.rmtree(_session_dir, ignore_errors=True)
        os.environ.pop(SESSION_ENV, None)
