#!/usr/bin/env bash
# Creates .venv with the CPU build of torch and packrat (editable).
# Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh test
# PACKRAT_RUNTIMES=none installs torch alone as the runtime (no OpenVINO, ONNX Runtime, ONNX exporter).
# PACKRAT_INSTALLER=pip installs with pip only (the default, uv, falls back to pip by itself).
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
# packrat's own bytecode, at every call: its files change between calls, and an editable install
# compiles none of them, so under PYTHONDONTWRITEBYTECODE (as CI's processes are) every process
# compiled packrat again (the suite's CPU, set-up included: 16 min 21 s, and 10 min 25 s with this;
# docs/testing.md).
own_bytecode() {
    .venv/bin/python -m compileall -q -j 0 packrat handlers ios_scheduler loadtest >/dev/null || true
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    own_bytecode
    exit 0
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
# The installer: uv where it can be had (a fresh clone's test set-up took 155 s with pip, which
# unpacks every wheel again, and 53 s with uv, which links them from its cache and compiles in parallel:
# docs/testing.md);
# pip where uv cannot be installed, fails, or PACKRAT_INSTALLER=pip. uv reads no pip.conf: pip's
# index variables are handed on, and a failed uv install is done again by pip.
pip=(.venv/bin/python -m pip install --quiet)
uv=()
if [ "${PACKRAT_INSTALLER:-uv}" = uv ] && { [ -x .venv/bin/uv ] || "${pip[@]}" uv >/dev/null 2>&1; }; then
    export UV_INDEX_URL=${UV_INDEX_URL:-${PIP_INDEX_URL:-}} UV_EXTRA_INDEX_URL=${UV_EXTRA_INDEX_URL:-${PIP_EXTRA_INDEX_URL:-}}
    [ -n "$UV_INDEX_URL" ] || unset UV_INDEX_URL
    [ -n "$UV_EXTRA_INDEX_URL" ] || unset UV_EXTRA_INDEX_URL
    uv=(.venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python)  # bytecode as pip writes it: a process started under PYTHONDONTWRITEBYTECODE compiles none
fi
install() {  # install ARGS...: with uv if there is one, again with pip if uv fails
    if [ ${#uv[@]} -gt 0 ] && "${uv[@]}" "$@"; then
        return 0
    fi
    [ ${#uv[@]} -eq 0 ] || echo "setup: uv failed; installing with pip" >&2
    "${pip[@]}" "$@"
}
# torch first, CPU build: a local wheel (pip's find-links) if there is one, else the CPU index.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: installing $torch_spec (CPU build)"
    local_wheel=$("${pip[@]}" --dry-run --no-index --no-deps --report - "$torch_spec" 2>/dev/null \
        | .venv/bin/python -c "import json, sys, urllib.parse as u; print(u.unquote(u.urlparse(json.load(sys.stdin)['install'][0]['download_info']['url']).path))" 2>/dev/null || true)
    if [ -n "$local_wheel" ] && [ -f "$local_wheel" ]; then
        install --no-deps "$local_wheel"  # its dependencies come with packrat's, below
    else
        install --index-url "$cpu_index" "$torch_spec"
    fi
fi
# Whatever comes next keeps this torch: no requirement may bring another build.
pin=$(mktemp "${TMPDIR:-/tmp}/packrat-torch-pin-XXXXXX.txt")
trap 'rm -f "$pin"' EXIT
.venv/bin/python -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" > "$pin"
# The packages an old checkout installed under the name "packrat" (an unrelated project's on the index).
if .venv/bin/python -m pip show --quiet packrat >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall --quiet --yes packrat
fi
echo "setup: installing packrat${extras:+[$extras]}"
if [ "${PACKRAT_RUNTIMES:-}" = none ]; then  # torch alone: every dependency but the runtimes
    install --constraint "$pin" --no-deps -e .
    mapfile -t deps < <(.venv/bin/python - <<'PY'
import tomllib
runtimes = {"openvino", "onnxruntime", "onnx", "onnxscript"}
for spec in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    name = spec.split("=")[0].split(">")[0].split("<")[0].split("[")[0].strip()
    if name not in runtimes:
        print(spec)
PY
)
    install --constraint "$pin" "${deps[@]}"
else
    install --constraint "$pin" -e ".${extras:+[$extras]}"
fi
own_bytecode
echo "$want" > "$stamp"
