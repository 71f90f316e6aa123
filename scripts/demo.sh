#!/usr/bin/env bash
# Sets up .venv and runs the main job: `packrat demo` (extra arguments go to it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/packrat demo "$@"
