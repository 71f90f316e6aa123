#!/usr/bin/env bash
# The many-core suite: one command for a machine with many CPU cores (e.g. 16), torch installed, no
# Java. Everything goes under OUT_DIR; progress to stderr; OUT_DIR/SUMMARY.md (rewritten after every
# step) holds the tables for docs/benchmarks/many-core.md, each under its exact command, and per B the
# verdicts: packrat against the best peer, predicted / served, plan against the oracle.
#
#   bash benchmarks/device_suite.sh OUT_DIR
#
# Steps and their budgets (530 s in all, within a 9-minute call; docs/benchmarks/many-core.md has more):
#   profile  (190 s) `packrat profile` (its search, --budget-s the step's less PROFILE_MARGIN) of MODEL,
#                    threads 1..T, batches 1..32, loaded, served raw tensors -> MODEL.csv, MODEL-search.json, MODEL-plans.json
#   peers    (170 s) `packrat bench peers` at B = 8,16, 10 rounds of 5 batches: the plan and its fat pool against
#                    ONNX Runtime and OpenVINO (LATENCY, THROUGHPUT) -> peers.md, peers.json (torch-compile and
#                    eager only when named: their compiles would take half the budget)
#   oracle   (170 s) `packrat bench oracle` at B = 16, 10 rounds, its configurations under each runtime -> oracle.json
#   bench    (110 s) only when asked: `packrat bench --pool-only`, the fat and the planned pool
#   ios      (300 s) only when asked: benchmarks/ios_networks.py, Inception-v3 and RandWire at batch 1 on 8, 16 threads
#   ios-plan (300 s) only when asked: `packrat profile --ios` of Inception-v3 at batch 1, the plan and the oracle
#                    at B = 1 with and without IOS instances (reusing the ios step's searches in the same OUT_DIR)
# The budgets are an estimate from the calls each step makes (docs/benchmarks/many-core.md); SUMMARY.md says so.
# A command past its budget is interrupted (profiles resume; peers, oracle and IOS keep what they measured),
# one that fails is noted with its last words; the suite goes on either way and exits with status 3 naming
# those steps. A step that yields little is in SUMMARY.md with what is missing and why.
#
# Settings, environment variables [defaults]: SUITE_MODEL [resnet50], SUITE_THREADS [every core: T; fewer are
# pinned with taskset], SUITE_STEPS [profile,peers,oracle; bench, ios, ios-plan too when named],
# SUITE_PROFILE_BATCHES [1,2,4,8,16,32], SUITE_PROFILE_WARMUP [1], SUITE_PROFILE_MIN_TIME [0.5],
# SUITE_PROFILE_KIND [contention: the loaded figures, the product's default; or isolated],
# SUITE_PROFILE_PAYLOAD [raw; or jpeg, text, model-only], SUITE_RUNTIMES [the profile's default; or a list],
# SUITE_GRAPH_MODE [compile, the product's default; script is cheaper], SUITE_PEERS_MODEL [MODEL],
# SUITE_PEERS_BATCHES [8,16], SUITE_PEERS_ROUNDS [10], SUITE_PEERS_ITERS [5],
# SUITE_PEERS [packrat,fat,openvino-latency,openvino-throughput,onnxruntime], SUITE_ORACLE_BATCHES [16],
# SUITE_ORACLE_ROUNDS [10], SUITE_ORACLE_FAMILY [all], SUITE_ORACLE_CONFIGS [4, beyond those always timed],
# SUITE_BENCH_BATCHES [8,16,32], SUITE_BENCH_ROUNDS [8], SUITE_IOS_MODELS [inception_v3,randwire],
# SUITE_IOS_THREADS [8,16; those above T dropped], SUITE_IOS_BATCHES [1],
# SUITE_IOS_PEERS [onnxruntime,onnxruntime-parallel,openvino], SUITE_IOS_SEARCH_BUDGET [60 s a search],
# SUITE_IOS_PLAN_MODEL [inception_v3], SUITE_IOS_PLAN_THREADS [1,4,8,16; those above T dropped],
# SUITE_IOS_PLAN_ROUNDS [5], SUITE_IOS_PLAN_GRAPH_MODE [script], SUITE_IOS_PLAN_RUNTIMES [every installed one
# but torch-compile: built in seconds], SUITE_EVERY_RUNTIME [0; 1: ios-plan measures IOS at every point],
# SUITE_BUDGET_PROFILE, _PEERS, _ORACLE, _BENCH, _IOS, _IOS_PLAN [seconds]. Python: .venv/bin/python when there
# is one, else python3. Re-running into the same OUT_DIR resumes the profile and keeps finished IOS cases.
# OpenVINO, where it is not installed, can come as wheels on PYTHONPATH (docs/benchmarks/many-core.md says how).

set -euo pipefail

usage() { sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; }
if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
    usage
    [[ $# -eq 1 ]] && exit 0 || exit 2
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
cd "$REPO"
if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# OUT as the commands show it: relative to the repository when inside it
SHOWN_OUT=$(realpath -m --relative-to="$REPO" "$OUT")
[[ $SHOWN_OUT == ..* ]] && SHOWN_OUT=$OUT

# each NAME=default below is SUITE_NAME where that is set (the head lists them)
for setting in MODEL=resnet50 PROFILE_BATCHES=1,2,4,8,16,32 PROFILE_KIND=contention PROFILE_WARMUP=1 \
    PROFILE_MIN_TIME=0.5 PROFILE_PAYLOAD=raw GRAPH_MODE=compile RUNTIMES=default PEERS_BATCHES=8,16 PEERS_ROUNDS=10 \
    PEERS_ITERS=5 PEERS=packrat,fat,openvino-latency,openvino-throughput,onnxruntime BENCH_BATCHES=8,16,32 \
    BENCH_ROUNDS=8 ORACLE_BATCHES=16 ORACLE_ROUNDS=10 ORACLE_FAMILY=all ORACLE_CONFIGS=4 \
    IOS_MODELS=inception_v3,randwire IOS_THREADS=8,16 IOS_BATCHES=1 IOS_PEERS=onnxruntime,onnxruntime-parallel,openvino \
    IOS_SEARCH_BUDGET=60 IOS_PLAN_MODEL=inception_v3 IOS_PLAN_THREADS=1,4,8,16 IOS_PLAN_ROUNDS=5 \
    IOS_PLAN_GRAPH_MODE=script; do
    given=SUITE_${setting%%=*}
    declare "${setting%%=*}=${!given:-${setting#*=}}"
done
PEERS_MODEL=${SUITE_PEERS_MODEL:-$MODEL}
if [[ $PROFILE_PAYLOAD == model-only ]]; then PAYLOAD_ARGS=(--model-only); else PAYLOAD_ARGS=(--payload "$PROFILE_PAYLOAD"); fi
RUNTIME_ARGS=()
[[ $RUNTIMES == default || $RUNTIMES == installed ]] || RUNTIME_ARGS=(--runtimes "$RUNTIMES")
EVERY_RUNTIME_ARGS=()
[[ ${SUITE_EVERY_RUNTIME:-0} == 1 ]] && EVERY_RUNTIME_ARGS=(--every-runtime)
STEPS=",${SUITE_STEPS:-profile,peers,oracle},"
case $PROFILE_KIND in
    isolated | contention) ;;
    *) echo "device_suite: SUITE_PROFILE_KIND must be isolated or contention, not '$PROFILE_KIND'" >&2; exit 2 ;;
esac
declare -A BUDGET=([profile]=${SUITE_BUDGET_PROFILE:-190} [peers]=${SUITE_BUDGET_PEERS:-170} [oracle]=${SUITE_BUDGET_ORACLE:-170}
                   [bench]=${SUITE_BUDGET_BENCH:-110} [ios]=${SUITE_BUDGET_IOS:-300} [ios-plan]=${SUITE_BUDGET_IOS_PLAN:-300})
# where the budgets come from: SUMMARY.md says it (replace with the run they were set from)
BUDGETS_FROM="an estimate, not yet from a run of these settings (this script's head says how it was made)"
if env | grep -q '^SUITE_BUDGET_'; then BUDGETS_FROM="set by SUITE_BUDGET_* where given, else $BUDGETS_FROM"; fi
PROFILE_MARGIN=60  # the points under way when the search's --budget-s ends, and the profile's writing after it

say() { echo "[suite $(date +%H:%M:%S)] $*" >&2; }
die() { say "FAILED: $*"; exit 1; }
wants() { [[ $STEPS == *",$1,"* ]]; }
shell_words() {  # the arguments as one command line, quoting only where the shell needs it
    local word line=""
    for word in "$@"; do
        [[ $word =~ ^[][A-Za-z0-9_./=:,+@%-]+$ ]] || word=$(printf '%q' "$word")
        line+=" $word"
    done
    echo "${line# }"
}

# ---- preflight: python, torch, the cores -------------------------------------------------------

# One python (torch loads once): the imports every step needs, the cores, and OUT/machine.json.
read -r ALL_CORES T CPUS BUILT_FAST < <("$PY" - "${SUITE_THREADS:-0}" "$OUT/machine.json" "$PY" <<'EOF'
import datetime, json, os, platform, sys
try:
    import numpy, torch, tqdm  # noqa: F401
except ImportError:
    print("no-torch")
    sys.exit()
try:  # the folders beside packrat/ import as packrat.* only once it is installed (pyproject.toml)
    import packrat.ios_scheduler  # noqa: F401
except ImportError:
    print("no-install")
    sys.exit()
from packrat.machine.topology import cpu_model, detect
cores = detect().cores
wanted = int(sys.argv[1]) or len(cores)
chosen = list(cores[:max(1, min(wanted, len(cores)))])
json.dump({"cpu": cpu_model(), "threads": len(chosen), "cores": chosen, "logical_cpus": os.cpu_count(),
           "torch": torch.__version__, "python": platform.python_version(), "python_path": sys.argv[3],
           "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "settings": {k: v for k, v in sorted(os.environ.items()) if k.startswith("SUITE_")}},
          open(sys.argv[2], "w"), indent=2)
from packrat.models.runtimes import installed_runtimes
fast = [r for r in installed_runtimes() if r != "torch-compile"]  # those built in seconds: ios-plan's default
print(len(cores), len(chosen), ",".join(map(str, chosen)), ",".join(fast))
EOF
)
[[ ${ALL_CORES:-} != no-torch ]] || die "$PY cannot import torch, numpy and tqdm (run bash scripts/setup.sh, or install them)"
[[ ${ALL_CORES:-} != no-install ]] || die "packrat is not installed in $PY (run bash scripts/setup.sh, or, beside a torch of your own: $PY -m pip install --no-deps --no-build-isolation -e .)"
[[ -n ${CPUS:-} ]] || die "could not read the cores with packrat.machine.topology (SUITE_THREADS, if set, must be a number)"
if [[ -n ${SUITE_THREADS:-} && $SUITE_THREADS -gt $ALL_CORES ]]; then
    say "SUITE_THREADS=$SUITE_THREADS: packrat sees only $ALL_CORES cores; using T=$T"
fi
PIN=()
if (( T < ALL_CORES )); then
    command -v taskset >/dev/null || die "SUITE_THREADS=$T needs taskset to keep the commands on $T cores"
    PIN=(taskset -c "$CPUS")
fi
at_most_t() {  # at_most_t LIST: the comma-separated thread counts up to T (T itself when none is)
    local kept
    kept=$(tr ',' '\n' <<<"$1" | awk -v t="$T" '$1 != "" && $1 <= t' | paste -sd, -)
    echo "${kept:-$T}"
}
if wants ios && [[ $(at_most_t "$IOS_THREADS") != "$IOS_THREADS" ]]; then
    say "IOS threads $IOS_THREADS capped to the $T cores: $(at_most_t "$IOS_THREADS")"
fi
IOS_THREADS=$(at_most_t "$IOS_THREADS")
IOS_PLAN_THREADS=$(at_most_t "$IOS_PLAN_THREADS")

STEPS_TSV=$OUT/steps.tsv
printf 'budgets\t%s\n' "$BUDGETS_FROM" >"$STEPS_TSV"
say "$MODEL on T=$T cores ($CPUS), python $PY, results in $OUT"

# ---- steps ----------------------------------------------------------------------------------

OVER=()  # steps that ran out of budget or failed
begin() {  # begin KEY TITLE
    STEP=$1 STEP_TITLE=$2 STEP_START=$SECONDS STEP_STATUS=ok
    say "($STEP) $STEP_TITLE: budget ${BUDGET[$STEP]} s"
}
run() {  # run LOG CMD...: CMD's stdout to LOG and stderr; 124 when the step's budget ran out, 1 when CMD failed
    local log=$1 rc=0 shown why
    shift
    shown=$(shell_words "${PIN[@]}" "$@")
    shown=${shown//"$OUT"/$SHOWN_OUT}
    printf 'cmd\t%s\t%s\n' "$STEP" "$shown" >>"$STEPS_TSV"
    local left=$(( BUDGET[$STEP] - (SECONDS - STEP_START) ))
    if (( left <= 0 )); then
        STEP_STATUS="budget spent: not run: $shown"
        return 124
    fi
    say "\$ $shown"
    # stdout to LOG; stderr to the terminal and to OUT/stderr.txt, whose last words say why a command failed
    { timeout --signal=INT --kill-after=20 "$left" "${PIN[@]}" "$@" 2>&1 1>&3 3>&- | tee "$OUT/stderr.txt" >&2; } 3>&1 \
        | tee "$log" >&2 || rc=$?
    if (( rc == 124 || rc == 137 )); then
        local setting=SUITE_BUDGET_${STEP^^}
        STEP_STATUS="stopped at its budget of ${BUDGET[$STEP]} s (${setting//-/_})"
    elif (( rc != 0 )); then  # packrat's own "COMMAND: error: ..." lines, else the last line (a traceback's error)
        why=$(tr '\r' '\n' <"$OUT/stderr.txt" | grep -v '^[[:space:]]*$' | sed -n '/: error: /,$p')
        [[ -n $why ]] || why=$(tr '\r' '\n' <"$OUT/stderr.txt" | grep -v '^[[:space:]]*$' | tail -n 1)
        STEP_STATUS="failed (exit $rc): $(tr '\t\n' '  ' <<<"$why")"
    fi
    (( rc == 0 )) || say "($STEP) $STEP_STATUS"
    (( rc == 0 )) || return $(( rc == 124 || rc == 137 ? 124 : 1 ))
}
end() {
    local took=$(( SECONDS - STEP_START ))
    printf 'step\t%s\t%s\t%s\t%s\t%s\n' "$STEP" "$STEP_TITLE" "$took" "${BUDGET[$STEP]}" "$STEP_STATUS" >>"$STEPS_TSV"
    [[ $STEP_STATUS == ok ]] || OVER+=("$STEP")
    say "($STEP) took $took s (budget ${BUDGET[$STEP]} s)"
    "$PY" benchmarks/device_suite_summary.py "$OUT"
}

PROFILE=$OUT/$MODEL.csv
SEARCH_BUDGET=$(( BUDGET[profile] > 2 * PROFILE_MARGIN ? BUDGET[profile] - PROFILE_MARGIN : BUDGET[profile] / 2 ))
if wants profile; then
    begin profile "profile of $MODEL (the search, --budget-s $SEARCH_BUDGET), threads 1-$T, batches $PROFILE_BATCHES, $PROFILE_KIND"
    if run "$OUT/$MODEL-search.json" "$PY" -m packrat.cli profile --model "$MODEL" --threads "1-$T" \
        --batches "$PROFILE_BATCHES" --warmup "$PROFILE_WARMUP" --min-time "$PROFILE_MIN_TIME" "${PAYLOAD_ARGS[@]}" \
        "--$PROFILE_KIND" --graph-mode "$GRAPH_MODE" "${RUNTIME_ARGS[@]}" --budget-s "$SEARCH_BUDGET" --json \
        --out "$PROFILE"; then
        run "$OUT/$MODEL-plans.json" "$PY" -m packrat.cli plan --profile "$PROFILE" --threads "$T" --json || true
    fi
    end
fi
if [[ ! -e $PROFILE ]] && ! wants profile && { wants bench || wants oracle || wants peers; }; then
    die "no profile at $PROFILE: the bench, oracle and peers steps plan from it (add profile to SUITE_STEPS)"
fi

if wants peers; then
    begin peers "packrat's plan against its peers, $PEERS_MODEL, B = $PEERS_BATCHES, $PEERS_ROUNDS rounds"
    run "$OUT/peers.md" "$PY" -m packrat.cli bench peers --model "$PEERS_MODEL" --profile "$PROFILE" --cores "$T" \
        --batches "$PEERS_BATCHES" --rounds "$PEERS_ROUNDS" --iters "$PEERS_ITERS" --peers "$PEERS" --keep-caches \
        --json "$OUT/peers.json" || true
    end
fi

if wants oracle; then
    begin oracle "planner vs the oracle ($ORACLE_FAMILY family, each runtime), B = $ORACLE_BATCHES, $ORACLE_ROUNDS rounds"
    run "$OUT/oracle.txt" "$PY" -m packrat.cli bench oracle --model "$MODEL" --profile "$PROFILE" --threads "$T" \
        --batches "$ORACLE_BATCHES" --rounds "$ORACLE_ROUNDS" --family "$ORACLE_FAMILY" --max-configs "$ORACLE_CONFIGS" \
        --json "$OUT/oracle.json" --quiet || true
    end
fi

if wants bench; then
    begin bench "pool-only bench, fat vs plan, B = $BENCH_BATCHES, $BENCH_ROUNDS rounds"
    run "$OUT/pool-bench.txt" "$PY" -m packrat.cli bench --pool-only --model "$MODEL" --profile "$PROFILE" \
        --batch-size "$BENCH_BATCHES" --rounds "$BENCH_ROUNDS" --payload raw --cases in-process,pool-fat,pool-plan \
        --out "$OUT/pool-bench" || true
    end
fi

if wants ios; then
    begin ios "IOS on $IOS_MODELS, batch $IOS_BATCHES, threads $IOS_THREADS"
    run "$OUT/ios-networks.md" "$PY" benchmarks/ios_networks.py --models "$IOS_MODELS" --batches "$IOS_BATCHES" \
        --threads "$IOS_THREADS" --peers "$IOS_PEERS" --budget "$IOS_SEARCH_BUDGET" --out "$OUT/ios-networks" || true
    end
fi

if wants ios-plan; then
    begin ios-plan "IOS instances in the plan: $IOS_PLAN_MODEL at B = 1, threads $IOS_PLAN_THREADS"
    IOS_PROFILE=$OUT/$IOS_PLAN_MODEL-ios.csv
    mkdir -p "$OUT/ios-schedules"
    # the ios step's searches, where it ran, are the profile's: same model, threads and batch
    for found in "$OUT"/ios-networks/"$IOS_PLAN_MODEL"-b1-t*.schedule.json; do
        [[ -e $found ]] || continue
        threads=${found##*-t}
        cp -n "$found" "$OUT/ios-schedules/$IOS_PLAN_MODEL-t${threads%.schedule.json}-b1.json"
    done
    if run "$OUT/$IOS_PLAN_MODEL-ios-profile.log" "$PY" -m packrat.cli profile --model "$IOS_PLAN_MODEL" \
        --threads "$IOS_PLAN_THREADS" --batches 1 --warmup "$PROFILE_WARMUP" --min-time "$PROFILE_MIN_TIME" \
        "${PAYLOAD_ARGS[@]}" "--$PROFILE_KIND" --graph-mode "$IOS_PLAN_GRAPH_MODE" \
        --runtimes "${SUITE_IOS_PLAN_RUNTIMES:-$BUILT_FAST}" "${EVERY_RUNTIME_ARGS[@]}" --ios \
        --ios-cache "$OUT/ios-schedules" --out "$IOS_PROFILE" --quiet; then
        run "$OUT/ios-plan.json" "$PY" -m packrat.cli plan --profile "$IOS_PROFILE" --threads "$T" --batch 1 --json \
            && run "$OUT/oracle-ios.txt" "$PY" -m packrat.cli bench oracle --model "$IOS_PLAN_MODEL" --profile "$IOS_PROFILE" \
                --threads "$T" --batches 1 --rounds "$IOS_PLAN_ROUNDS" --max-configs "$ORACLE_CONFIGS" \
                --ios-cache "$OUT/ios-schedules" --json "$OUT/oracle-ios.json" --quiet || true
    fi
    end
fi

say "done in $SECONDS s: $OUT/SUMMARY.md"
if (( ${#OVER[@]} )); then
    say "NOT OK: ${OVER[*]} (over budget or failed: SUMMARY.md says which and why; their results are partial)"
    exit 3
fi
echo "$OUT/SUMMARY.md"
