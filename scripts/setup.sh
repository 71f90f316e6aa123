#!/usr/bin/env bash
# Creates .venv with the CPU build of torch and packrat (editable).
# Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh test
# PACKRAT_RUNTIMES=none installs torch alone as the runtime (no OpenVINO, ONNX Runtime, ONNX exporter).
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
if [ "${PACKRAT_RUNTIMES:-}" = none ] && [ -n "$extras" ]; then
    echo "error: PACKRAT_RUNTIMES=none installs torch alone and takes no extras (they would bring the runtimes)" >&2
    exit 2
fi

python=${PYTHON:-python3}
stamp=.venv/.packrat-setup-stamp${extras:+-$extras}  # one per extras, so demo and tests do not undo each other
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$torch_spec-${PACKRAT_RUNTIMES:-all}
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
# The packages an old checkout installed under the name "packrat" (an unrelated project's on the index).
if .venv/bin/python -m pip show --quiet packrat >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall --quiet --yes packrat
fi
echo "setup: installing packrat${extras:+[$extras]}"
if [ "${PACKRAT_RUNTIMES:-}" = none ]; then  # torch alone: every dependency but the runtimes
    "${pip[@]}" --no-deps -e .
    .venv/bin/python - <<'PY' | xargs "${pip[@]}"
import tomllib
runtimes = {"openvino", "onnxruntime", "onnx", "onnxscript"}
for spec in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    name = spec.split("=")[0].split(">")[0].split("<")[0].split("[")[0].strip()
    if name not in runtimes:
        print(spec)
PY
else
    "${pip[@]}" -e ".${extras:+[$extras]}"
fi
echo "$want" > "$stamp"
