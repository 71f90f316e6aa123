#!/usr/bin/env bash
# Sets up .venv (with the test extras) and runs the test suite. Extra arguments go to pytest;
# --quick stands for the quick tier, -m "not integration and not slow" (the README says what each marker means).
#
# The whole suite runs in two pytest runs (docs/testing.md): first the tests marked `serial` (they
# time things, or need the cores to themselves) alone, then every other test on TESTS_WORKERS
# pytest-xdist workers (default: 2 where 2 cores or more are ours; 4 were no faster, and
# one run of five then lost a request in a KServe unload test: docs/testing.md), a file per worker at a time
# (--dist loadfile: a module's server or pool is started once). Both runs share one session
# directory (compile cache; tests/conftest.py). A -m given here is combined with each run's. The
# quick tier, TESTS_WORKERS=0 or 1, or a machine of one core: one plain pytest run, as before the
# split (the quick tier's short tests ran slower on two workers than on one: docs/testing.md). The
# exit status is pytest's: 5 (nothing collected) only where neither run collected a test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
args=()
marks=""
quick='not integration and not slow'
expect_mark=0
exitfirst=0
quick_only=0
for arg in "$@"; do
    if [ "$expect_mark" = 1 ]; then
        marks="${marks:+($marks) and }($arg)"; expect_mark=0
    elif [ "$arg" = "--quick" ]; then
        marks="${marks:+($marks) and }($quick)"; quick_only=1
    elif [ "$arg" = "-m" ]; then
        expect_mark=1
    elif [[ "$arg" == -m?* ]]; then
        marks="${marks:+($marks) and }(${arg#-m})"
    else
        [[ "$arg" == "-x" || "$arg" == "--exitfirst" ]] && exitfirst=1
        args+=("$arg")
    fi
done
python=.venv/bin/python
# The packages and conversions the tests build, kept between runs on this machine (in TMPDIR) under a
# key over the code that builds them: a fresh clone of the same code loads them, a change rebuilds
# (tests/conftest.py; TESTS_COMPILE_CACHE= empty: a cold cache of the run's own). Other keys' caches
# untouched for a day are removed, so one machine keeps about one.
if [ -z "${TESTS_COMPILE_CACHE+set}" ]; then
    key=$(cat packrat/models/*.py pyproject.toml | sha256sum | cut -c1-12)
    export TESTS_COMPILE_CACHE=${TMPDIR:-/tmp}/packrat-tests-compiled-$key
    find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'packrat-tests-compiled-*' ! -name "${TESTS_COMPILE_CACHE##*/}" \
        -mtime +0 -exec rm -rf {} + 2>/dev/null || true
fi
cores=$("$python" -c "import os; print(len(os.sched_getaffinity(0)))")
workers=${TESTS_WORKERS:-$([ "$cores" -ge 2 ] && [ "$quick_only" = 0 ] && echo 2 || echo 0)}
if [ "$workers" -le 1 ] || ! "$python" -c "import xdist" 2>/dev/null; then  # one run, as before the split
    exec "$python" -m pytest ${marks:+-m "$marks"} ${args[@]+"${args[@]}"}
fi

session=$(mktemp -d "${TMPDIR:-/tmp}/packrat-tests-XXXXXX")
trap 'rm -rf "$session"' EXIT
export TESTS_SESSION_DIR=$session

# The serial run collects only the files that hold serial tests (the whole suite's collection costs
# about 10 s), unless the arguments name paths of their own.
serial_paths=()
paths_given=0
for arg in ${args[@]+"${args[@]}"}; do
    [[ -e "${arg%%::*}" ]] && paths_given=1
done
[ "$paths_given" = 1 ] || mapfile -t serial_paths < <(grep -l "pytest.mark.serial" tests/test_*.py)
echo "test.sh: the serial tests, alone (-m '${marks:+($marks) and }serial')"
set +e
"$python" -m pytest -m "${marks:+($marks) and }serial" ${args[@]+"${args[@]}"} ${serial_paths[@]+"${serial_paths[@]}"}
serial=$?
set -e
if [ "$serial" = 2 ] || [ "$serial" = 3 ] || [ "$serial" = 4 ] || { [ "$exitfirst" = 1 ] && [ "$serial" = 1 ]; }; then
    exit "$serial"  # interrupted, an internal or usage error, or -x with a failure: no second run
fi
echo "test.sh: the other tests on $workers workers (-n $workers --dist loadfile -m '${marks:+($marks) and }not serial')"
set +e
"$python" -m pytest -n "$workers" --dist loadfile -m "${marks:+($marks) and }not serial" ${args[@]+"${args[@]}"}
parallel=$?
set -e
if [ "$serial" = 5 ] && [ "$parallel" = 5 ]; then
    exit 5  # neither run collected a test
fi
[ "$serial" = 5 ] && serial=0
[ "$parallel" = 5 ] && parallel=0
if [ "$serial" != 0 ]; then
    echo "test.sh: the serial run failed (exit $serial)" >&2
    exit "$serial"
fi
exit "$parallel"
