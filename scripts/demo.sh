#!/usr/bin/env bash
# Sets up .venv and runs the main job: `packrat demo` (extra arguments go to it); says how long each took.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/setup.sh
setup_s=$((SECONDS - start))
echo "demo.sh: set-up took ${setup_s} s"
.venv/bin/packrat demo "$@"
echo "demo.sh: set-up ${setup_s} s, the demo $((SECONDS - start - setup_s)) s, $((SECONDS - start)) s in all"
