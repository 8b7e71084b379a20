# Shared plumbing of the device-session drivers, bench/multigpu_session.sh (issue 32) and
# bench/gpu_session.sh (issues 26 and 30): sourced by them, not run on its own.
#
# The driver sets, before `session_begin`:
#   SESSION           the name of what comes back: $OUT/$SESSION-<steps>.tar.gz and $OUT/summary-<steps>.txt
#   MIN_GPUS_DEFAULT  setup stops below this many GPUs (MIN_GPUS overrides it; 0 for a dry run)
#   GPUS_WHY          the end of setup's stopping line ("issue 32's runs need 2 or more")
#   steps             the array of steps to run, setup first
# then runs its steps with `step` (and `summarize`s of its own), and ends with `session_end`.
#
# From the environment:
#   PYTHON      the interpreter (default python3: on the lent hosts, the one with torch)
#   SITE        carried wheels (.whl/, else .gpuwheels/) are installed here (default /tmp/site)
#   SHIM        the entry points of the checkout's code go here (default /tmp/shim)
#   RESULTS     this call's folder (default /tmp/$SESSION-<steps>)
#   OUT         the device call's return folder: the tarball and the summary are copied into it
#   CALL_LIMIT  seconds the whole call may take (default 590: a device call is cut at 600): each
#               step's limit is cut to what is left of it, and a step with under STEP_MIN
#               (default 30) seconds left is skipped, so the tarball and summary always come back
#   NATIVE_FAULTS  1 (default, where gcc is): setup builds bench/native_fault.c and LD_PRELOADs it
#               into every step, so a native crash writes its thread and native stack to stderr; 0: not
#   DRY_RUN=1   `step` logs each command and runs none (with MIN_GPUS=0: the plumbing alone, on a
#               machine with no GPU; tests/test_gpu_session.py)
# shellcheck shell=bash

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
SHIM=${SHIM:-/tmp/shim}
CALL_LIMIT=${CALL_LIMIT:-590}
STEP_MIN=${STEP_MIN:-30}
DRY_RUN=${DRY_RUN:-}
GPUS=0

session_begin() {
    LABEL=$(IFS=-; echo "${steps[*]:1}"); LABEL=${LABEL:-setup}
    RESULTS=${RESULTS:-/tmp/$SESSION-$LABEL}
    mkdir -p "$RESULTS"
    SUMMARY=$RESULTS/summary.txt
    [ -n "$DRY_RUN" ] && note "dry run: no step's command runs"
    return 0
}

note() { echo "$*" | tee -a "$SUMMARY"; }

# A step's limit cut to what is left of the call (CALL_LIMIT), less 10 s for the tarball.
cap() {
    local left=$((CALL_LIMIT - SECONDS - 10))
    if [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}

# Runs one step under its limit, its output into $RESULTS/<step>.log; notes how it ended.
step() {
    local name=$1 limit began=$SECONDS rc
    limit=$(cap "$2"); shift 2
    echo "== $name (limit ${limit}s): $*" >> "$RESULTS/$name.log"
    if [ "$limit" -lt "$STEP_MIN" ]; then
        note "-- $name: SKIPPED, ${limit}s left of the call's ${CALL_LIMIT}s"
        return 0
    fi
    if [ -n "$DRY_RUN" ]; then
        note "-- $name: dry run (limit ${limit}s)"
        return 0
    fi
    timeout --signal=TERM --kill-after=20 "$limit" "$@" >> "$RESULTS/$name.log" 2>&1
    rc=$?
    local how="exit $rc"
    [ $rc -eq 124 ] && how="CUT at its ${limit}s limit"
    note "-- $name: $how after $((SECONDS - began))s"
    return 0
}

setup() {
    local wheels
    wheels=$(ls .whl/*.whl 2>/dev/null || ls .gpuwheels/*.whl 2>/dev/null)  # one folder: two versions stop pip
    if [ -n "$wheels" ]; then  # carried (`carry: [".whl"]`): a fresh machine has none of them
        # shellcheck disable=SC2086
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $wheels \
            || { note "setup: the carried wheels did not install into $SITE"; return 1; }
    fi
    # Bytecode up front, as pip writes it for a user's install: else every process of a step (the
    # collector, each decode worker, 16 programs) compiled the same modules at its start, ~7 % of
    # the workers' and the collector's samples in a 22 s fan-in profile (2026-11-29).
    $PY -m compileall -q -j 0 "$SITE" "$ROOT/cuptistream" "$ROOT/sources" "$ROOT/sinks" > /dev/null 2>&1 \
        || note "setup: compileall failed (processes compile at their start)"
    # The checkout's code runs, not a wheel's: a stale wheel in $SITE cannot shadow this branch.
    $PY tests/gpu/entry_points.py "$SHIM"
    export PYTHONPATH=$ROOT:$SHIM:$SITE${PYTHONPATH:+:$PYTHONPATH}
    export PATH=$SITE/bin:$PATH  # console scripts of carried wheels (py-spy)
    # A native crash's thread and stack on the step's stderr (bench/native_fault.c): a DDP rank died
    # on a thread with no Python state, twice, and Python's fault handler could not name it.
    if [ "${NATIVE_FAULTS:-1}" = 1 ] && [ "${DRY_RUN:-0}" != 1 ] && command -v gcc > /dev/null; then
        gcc -O1 -g -shared -fPIC -o /tmp/native_fault.so bench/native_fault.c \
            && export LD_PRELOAD=/tmp/native_fault.so || note "setup: bench/native_fault.c did not build"
    fi
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then  # the GPUs the steps may use, not the host's (fanin's G)
        local visible
        visible=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
        [ "$visible" -lt "$GPUS" ] && GPUS=$visible
    fi
    {
        date -u; git rev-parse --short HEAD 2>/dev/null; git status --short 2>/dev/null | head -20
        nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader
        nvidia-smi topo -m 2>/dev/null
        $PY -c "import torch, torch.distributed as d; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count(), 'nccl available', d.is_nccl_available())"
        $PY -c "import cuptistream, cuptistream.sources.activity, cuptistream.run.program as l; print('cuptistream from', cuptistream.__file__, 'probe_environment' in dir(l))"
        nproc; lscpu 2>/dev/null | grep -E "^(Model name|Thread|Core|Socket|NUMA node[0-9]* CPU)"; env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)_' | sort
    } > "$RESULTS/env.txt" 2>&1
    local missing need=${MIN_GPUS:-$MIN_GPUS_DEFAULT}
    missing=$($PY -c "
import importlib.util as u
print(' '.join(m for m in ('pytest', 'msgspec', 'trio', 'zstandard', 'yaml', 'numpy', 'cupti') if u.find_spec(m) is None))")
    note "setup: $GPUS GPUs; $(grep -m1 '^torch' "$RESULTS/env.txt"); $(grep -m1 'cuptistream from' "$RESULTS/env.txt")"
    if [ -n "$missing" ]; then
        note "setup: not importable: $missing (carry their wheels in .whl/). Stopping."
        return 1
    fi
    if [ "$GPUS" -lt "$need" ]; then  # MIN_GPUS=0: a dry run of the script's plumbing
        note "setup: fewer than $need GPUs; $GPUS_WHY. Stopping."
        return 1
    fi
}

# bench/fanin.py's log, compact: its 'fanin:' lines and, per run, the figures that matter.
summarize_fanin() {
    [ -f "$1" ] || return 0
    grep -E '^fanin: |"check"' "$1" | $PY -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        print(line.rstrip()); continue
    r = json.loads(line)
    keep = ("probes", "nproc", "job_s", "window_s", "offered_records_per_s", "delivered_events_per_s", "steady_delivered_events_per_s", "dropped_events", "cupti_dropped_records", "drops", "errors_on_disk",
            "shed_records", "buffers_per_decode", "collector_cpu_s", "workers_cpu_s", "cpu_s_per_m_records", "steady_cpu_s_per_m_events", "cores_used", "peak_rss_anon_mib",
            "programs_by_device", "kernels_by_device", "ranks", "check")
    print(json.dumps({k: r[k] for k in keep if k in r}))
' | tee -a "$SUMMARY"
}

# Back from the device: the tarball of every result, log and summary of this call, and the summary.
session_end() {
    local tarball
    if [ -n "${OUT:-}" ]; then tarball=$OUT/$SESSION-$LABEL.tar.gz; else tarball=$RESULTS.tar.gz; fi
    # Recordings a cut step left behind (a fanin run killed before its clean-up) stay here: a file
    # over 8 MB would make the tarball too big to come back, and nothing reads them at home.
    # (paths as tar names them, relative to the folder above: -X matched no absolute path)
    (cd "$(dirname "$RESULTS")" && find "$(basename "$RESULTS")" -type f -size +8M) > "$RESULTS.big"
    while read -r big; do
        note "left out of the tarball: ${big#*/} ($(du -h "$(dirname "$RESULTS")/$big" | cut -f1))"
    done < "$RESULTS.big"
    tar czf "$tarball" -X "$RESULTS.big" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
    [ -n "${OUT:-}" ] && cp "$SUMMARY" "$OUT/summary-$LABEL.txt"
    echo "== results: $tarball ($(du -h "$tarball" | cut -f1))"
    echo "== summary"
    cat "$SUMMARY"
}
