#!/usr/bin/env bash
# Compiles .venv's Python files to bytecode: `hot` the packages nearly every process of packrat and
# its tests imports, `all` (the default) every installed package and packrat itself. Files already
# compiled are only looked at (about 2 s for all of them).
#
# Why: a process started under PYTHONDONTWRITEBYTECODE (as CI's are) compiles every module it imports
# afresh, every time, unless it was compiled beforehand (importing torch: 4.3 s against 1.9 s). uv
# installs without compiling; all of .venv took 38 s on 2 cores after 13 s of installing, `hot` 15 s
# (docs/testing.md). test.sh compiles `hot` before its first test and the rest beside its parallel run.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
case "$which" in
    hot)
        # What a pool instance, a profile's worker, a CLI command and a pytest worker import
        # (sys.modules after importing them); torch brings sympy, networkx and jinja2 where it compiles.
        paths=()
        for name in torch torchgen numpy sympy mpmath networkx jinja2 markupsafe filelock fsspec onnx onnxruntime \
                    onnxscript openvino openvino_telemetry PIL yaml tqdm psutil packaging typing_extensions.py \
                    _pytest pytest pluggy xdist execnet hypothesis; do
            [ -e "$site/$name" ] && paths+=("$site/$name")
        done
        paths+=(packrat)
        ;;
    all) paths=("$site" packrat) ;;
    *) echo "usage: $0 [hot|all]" >&2; exit 2 ;;
esac
.venv/bin/python -m compileall -q -j 0 "${paths[@]}" >/dev/null || true  # a file that does not compile is compiled (and fails) where it is imported
