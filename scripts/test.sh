#!/usr/bin/env bash
# Sets up .venv (with the test extras) and runs the test suite. Extra arguments go to pytest;
# --quick stands for the quick tier, -m "not integration and not slow" (the README says what each marker means).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
args=()
for arg in "$@"; do
    if [ "$arg" = "--quick" ]; then
        args+=(-m "not integration and not slow")
    else
        args+=("$arg")
    fi
done
exec .venv/bin/python -m pytest ${args[@]+"${args[@]}"}
