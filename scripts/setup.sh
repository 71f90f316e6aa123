#!/usr/bin/env bash
# Creates .venv with the CPU build of torch and packrat (editable).
# Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh test
# Fast when nothing changed: a stamp of the inputs below skips the install.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
extras=${1:-}
torch_spec=${PACKRAT_TORCH_SPEC:-torch==2.13.0}
cpu_index=${PACKRAT_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

check_java() {
    local version major
    if ! version=$(java -version 2>&1 | head -n 1); then
        echo "error: Java 11+ is needed by TorchServe's frontend and 'java' was not found." >&2
        echo "       Install it, e.g. on Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2
        exit 1
    fi
    major=$(echo "$version" | sed -E 's/.*version "([0-9]+)(\.([0-9]+))?.*/\1 \3/' | awk '{ print ($1 == 1) ? $2 : $1 }')
    if [ -z "$major" ] || [ "$major" -lt 11 ]; then
        echo "error: TorchServe needs Java 11+, found: $version" >&2
        echo "       Install it, e.g. on Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2
        exit 1
    fi
}
check_java

python=${PYTHON:-python3}
stamp=.venv/.packrat-setup-stamp${extras:+-$extras}  # one per extras, so demo and tests do not undo each other
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$torch_spec
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet)
# torch first, CPU build: a local wheel (pip's find-links) if there is one, else the CPU index.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: installing $torch_spec (CPU build)"
    if "${pip[@]}" --dry-run --no-index --no-deps "$torch_spec" >/dev/null 2>&1; then
        "${pip[@]}" "$torch_spec"
    else
        "${pip[@]}" --index-url "$cpu_index" "$torch_spec"
    fi
fi
echo "setup: installing packrat${extras:+[$extras]}"
"${pip[@]}" -e ".${extras:+[$extras]}"
echo "$want" > "$stamp"
