#!/usr/bin/env bash
# The remaining one-GPU runs of issue 26 (always-on cost, full mode against bare CUPTI, statistics
# volume) and issue 30's fan-in on the 16-core host, for one H100/H200 (nvidia-h100-x1). Run on
# 2026-11-27 (docs/gpu-validation.md lists the calls and their commits).
#
#   bash bench/gpu_session.sh [STEP|GROUP ...]      # default: all, in the order below
#
# The plumbing is bench/device_lib.sh (shared with bench/multigpu_session.sh): carried wheels in
# .whl/ (or .gpuwheels/) installed into $SITE (default /tmp/site) on every call, the checkout's
# code on PYTHONPATH through tests/gpu/entry_points.py's shim, env.txt, every step under its limit
# and the call's (CALL_LIMIT, default 590 s), and at the end $OUT/gpu-<steps>.tar.gz and
# $OUT/summary-<steps>.txt (two files back per call), the summary also on stdout.
#
# Steps, with their expected wall time on one H100 (16 cores) and the limit each runs under (s):
#
#   step           expected  limit  what
#   setup          ~0.3 min     -   GPU, versions, entry points; stops the script with no GPU
#   lost1          ~3.8 min   265   issue 26, <= 1 %: bench/budget_lost_time.py --workloads W1
#                                   --sessions 5 --seconds 25 (a process of ~45 s per session:
#                                   start, 2 s warm-up, 12 s base, 1 s settle, 25 s timed, stop);
#                                   each session's line printed and kept as it ends
#   lost2          ~4.1 min   285   the same for W2 (+4 s of setup per session)
#   lost3          ~4.1 min   285   the same for W3 (resolved attached: 0.36 % with a null of 0.01 %)
#   lost4          ~4.1 min   285   the same for W4. LOST_SESSIONS, LOST_SECONDS, LOST_LIMIT change
#                                   all four. Each prints the sessions pooled (bench/lost_pooled.py):
#                                   the resolution is ~80 ms/window * sqrt(windows) / seconds, so
#                                   0.25 % takes ~40 windows: LOST_SECONDS=45 (5 sessions, ~6 min).
#                                   Measured on the H200 (2026-11-28): at LOST_SECONDS=40 a W1 or W2
#                                   session took 63-66 s, at 35 a W4 session ~75 s (its model's
#                                   set-up): W4's 5 sessions need LOST_LIMIT=390 at 35 s, not 300
#   full13         ~4.2 min   275   issue 26, full mode against bare CUPTI at the end:
#                                   bench/overhead_gpu.py --rounds 5 --workloads W1,W3 --modes
#                                   none,bare,cuptistream --seconds 2 (its own plan: 4.15 min; its
#                                   --budget is the step's limit less 20 s, so the table comes back)
#   full24         ~6.0 min   390   the same for W2,W4 (plan: 6.0 min); then --merge with full13's
#                                   JSON when that call ran on this machine (else merge at home:
#                                   python bench/overhead_gpu.py --merge full_w13.json full_w24.json)
#   volume-start   ~0.1 min     -   issue 26, statistics volume over ONE recording of >= 10 min:
#                                   starts bench/budget_accuracy.py --modes budget --workloads W4
#                                   --seconds 660 (`cuptistream run -c configs/production.yaml`,
#                                   ~11.5 min with start and read-back) in the background (setsid
#                                   nohup, pinned to VOLUME_CPUS, default 12-15) and returns. Its
#                                   state is in $STATE (default /tmp/gpu-session-state) on THIS
#                                   machine: the next calls must follow within 30 s (the machine
#                                   goes back otherwise, and the recording with it) and on the same
#                                   machine (one is held 30 min at most: start it first). While it
#                                   runs ONLY CPU-only steps (fanin-cpu, fanin-block, fanin-onecore,
#                                   fanin-profile) may run: a GPU timing step would share the GPU
#                                   with it, and it would slow theirs
#   volume-wait    <= rest      -   waits for it (up to what is left of the call), then reports the
#                                   recording's MB per GPU-hour (issue 26's bound: 2 MB)
#   fanin-cpu      ~5   min   360   issue 30, CPU: bench/fanin.py --mode cpu --probes 1,4,8,16
#                                   --seconds 15 --runs 3 (12 runs of ~25 s: 15 s, start, read-back);
#                                   FANIN_PROBES, FANIN_SECONDS, FANIN_RUNS change them
#   fanin-block    ~2.5 min   240   --probes 16 --loops $BLOCK_LOOPS --full-policy block --runs
#                                   $BLOCK_RUNS (default 1000 and 1: 16 x 1000 x 3,716 = 59 M records
#                                   at one collector core's ~0.6-0.8 M/s, then read back. The docs'
#                                   --loops 2000 --runs 3 is ~15 min without decode workers)
#   fanin-replies  ~6   min   400   fanin-block's run with pipeline.worker_replies mapped, then shared, twice
#                                   (alternating, --loops 500 each; --workers auto): mapped's memory
#                                   against its rate on this host (issue 30; 8-13 % slower on the VM)
#   fanin-onecore  ~5   min   360   fanin-cpu with --collector-cpus 0 --program-cpus 1-15 (the
#                                   background recording is pinned to 12-15, off the collector's core)
#   fanin-profile  ~1   min    90   --probes 4 --seconds 12 --profile --profile-gil --no-check (the
#                                   probes and limit from FANIN_PROFILE_PROBES, FANIN_PROFILE_LIMIT); needs
#                                   py-spy (not on the lent image: carry its wheel in .whl/), else
#                                   skipped with one line
#   fanin-gpu-profile ~1.5 min 150  where the collector's time goes on the GPU: --mode gpu --probes 1,4
#                                   --seconds 10 --profile --no-check (py-spy, as fanin-profile; the
#                                   probes and e.g. --profile-gil from FANIN_PROFILE_ARGS), then
#                                   bench/profile_stages.py on each run's stacks
#   fanin-gpu-levels ~3.5 min 440   issue 30's GPU item: fanin-gpu's 16 programs with the file sink at zstd level 3,
#                                   then 1 (the default since 2026-11-28), twice (alternating): what level 1
#                                   saves in collector CPU per million records (a sixth on the VM)
#   fanin-gpu-replies ~3.5 min 440  issue 30's GPU item: fanin-gpu's 16 programs with pipeline.worker_replies
#                                   mapped, then shared, twice (FANIN_EXTRA as for fanin-gpu)
#   capture-stream ~0.5 min    90   W3's own activity buffers as the default config hands them over
#                                   (bench/capture_stream.py --seconds 0.2: a few MB), into
#                                   $RESULTS/w3_stream.cupti; back home, CPU benches replay them with
#                                   bench/fanin.py --replay-path
#   full3          ~5   min   320   W3 alone, full mode: --rounds $FULL3_ROUNDS (default 6); W3 is where
#                                   the collector falls behind in full mode (CUPTI drops, program slows);
#                                   FULL3_VARIANT=worker=bench/configs/default-decode-worker.yaml adds the
#                                   lone probe decoding in a worker process as a mode
#   steady4        ~3.5 min   240   bench/steady_cost_gpu.py --workload W4 --configs
#                                   none,configs/production.yaml --rounds 3 --base 8 --seconds 14: is the
#                                   +3-8 % block time between budget windows (lost4's drift check) the
#                                   session's or the machine's drift (`none` runs the same blocks)
#   steady1        ~6   min   420   steady4's question for W1 (launch-bound, the program's thread
#                                   pinned to STEADY_PIN, default core 3): none, state-only,
#                                   windows-idle, production; --rounds $STEADY_ROUNDS (default 3).
#                                   Pinned, W1 still flipped between ~18 and ~25 ms a block with no
#                                   session (2026-11-27): prefer budget_lost_time.py --drift
#   drift1         ~7.5 min   480   issue 26, W1 between windows: bench/budget_lost_time.py --workloads
#                                   W1 --sessions $DRIFT_SESSIONS (default 5) --seconds 25 --drift (each
#                                   session, then the same process with no session: ~45 s each);
#                                   DRIFT_BETWEEN=attach (or detach) runs production.yaml with that between_windows
#   between1       ~5   min   330   W1 between windows, piece by piece, toggled in one process per piece:
#                                   bench/between_windows.py --variants none,subscribe,state,attach --seconds
#                                   $BETWEEN_SECONDS (default 60) --phase 2 (~70 s a variant)
#   launch1        ~4   min   300   the same pieces per kernel launch, in C (no W1 speed flips):
#                                   bench/launch_cost.py (builds bench/launch_cost.cu with nvcc; each piece
#                                   toggled every 0.25 s, 80 phases; then 3 pairs alone / under
#                                   configs/production.yaml)
#   budget-tests   ~1.5 min   200   tests/gpu/test_budget_gpu.py: production.yaml's windows (CUPTI detached
#                                   between them), an on-demand window, graphs replayed across detaches
#                                   (BUDGET_TESTS_ARGS, e.g. "-k threads", picks tests)
#   gpu-tests      <= 5 min   300   any GPU tests: python -m pytest -v $GPU_TESTS (default: tests/gpu/test_activity_gpu.py
#                                   -k per_thread, the activity attributes as the program's CUPTI sees them)
#   attached1      ~7.5 min   500   the DDP attached-windows stress as ONE rank (CUPTISTREAM_TEST_WORLD=1:
#                                   tests/gpu/test_detach_multigpu.py -k attached, 3 runs of 125-141 s
#                                   on the H200): crashed a CUPTI thread in 5 of 5 runs before eeeba50
#                                   kept the copy kinds on while attached (3 of 3 passed with it); the
#                                   third toggles the API kinds too.
#                                   ATTACHED_K picks some (pytest -k; default "attached": all three)
#   launch-session ~2.5 min   200   bench/launch_cost.py --modes none: the C launch loop alone against under
#                                   production.yaml, LAUNCH_ROUNDS pairs (default 3)
#   accuracy-start ~0.1 min     -   issue 26's busy at equal work per second: in the background, for
#                                   each WORKLOAD:RATE of ACCURACY_RUNS (default "W4:50 W2:250 W5:250",
#                                   below what full tracing sustains: W4 ~64/s, W2 ~303/s, W5's W4
#                                   phase ~320 of its units/s) bench/budget_accuracy.py --workloads W
#                                   --rate R --seconds 300 (~11 min each); GPU steps wait for it
#   accuracy-wait  <= rest      -   waits for it, as volume-wait
#   fanin-gpu      ~2.5 min   170   issue 30 on the GPU: --mode gpu --probes $FANIN_GPU_PROBES (default
#                                   1,4,8,16; ~40 s each with start and read-back: 16 was cut at 170 s
#                                   on 2026-11-27) --seconds 15 --runs $FANIN_GPU_RUNS (default 1)
#
# fanin-block packs the captured buffers into 4 MiB ones (BLOCK_BUFFER_SIZE; what the activity
# source hands over on a busy GPU: docs/benchmarks.md, "Buffers the size a GPU fills"); fanin-cpu
# replays them as captured (~930 records a buffer), the issue's wording.
# FANIN_EXTRA is passed to fanin-cpu, fanin-block and fanin-gpu as it is (unquoted). Its default,
# '--workers 8', is what pipeline.decode_workers: auto gives a 16-core host (decode worker
# processes); '--workers 0,8' compares with in-thread decoding, but each value doubles the runs: set
# FANIN_RUNS=2 (or run fanin-cpu in a call of its own) so the step keeps to its limit. fanin-onecore
# runs --workers 0 (workers follow the collector's affinity: pinned to one core they add nothing).
#
# In all ~38 min of steps. One device call runs at most 10 minutes: five calls, each group's limits
# under the call's 590 s; A and B first and back to back on a fresh machine (the recording):
#
#   bash bench/gpu_session.sh A   # setup volume-start fanin-cpu fanin-profile   (~5.5 min; limits 450)
#   bash bench/gpu_session.sh B   # setup fanin-block fanin-onecore volume-wait  (~7.5 min; rest of the call)
#   bash bench/gpu_session.sh C   # setup lost1 lost2                            (~8.2 min; limits 550)
#   bash bench/gpu_session.sh D   # setup lost4 full13                           (~8.6 min; limits 560)
#   bash bench/gpu_session.sh E   # setup full24 fanin-gpu                       (~8.8 min; limits 560)
#
# A machine is held 30 minutes at most: A-D fit on one (D starts ~23 min in), E needs a second start.
# (`all` runs every step in one go, ~38 min, with no call limit: for a machine without a per-call
# limit, or started in the background with setsid nohup and collected by a later call.)
set -u
SESSION=gpu MIN_GPUS_DEFAULT=1 GPUS_WHY="these runs need a GPU"
# `all` is not one device call: no call limit (device_lib.sh's CALL_LIMIT) unless one is given
[ $# -eq 0 ] || [[ " $* " == *" all "* ]] && CALL_LIMIT=${CALL_LIMIT:-100000}
# shellcheck source=bench/device_lib.sh
source "$(dirname "$0")/device_lib.sh"
STATE=${STATE:-/tmp/gpu-session-state}  # what outlives a call: the background recording, full13's JSON
VOLUME_CPUS=${VOLUME_CPUS-12-15}  # VOLUME_CPUS= : not pinned
FANIN_EXTRA=${FANIN_EXTRA:---workers 8}  # pipeline.decode_workers: auto on 16 cores (see above)
STEPS="setup lost1 lost2 lost3 lost4 full13 full24 full3 steady4 steady1 drift1 between1 launch1 budget-tests gpu-tests attached1 launch-session volume-start volume-wait accuracy-start accuracy-wait fanin-cpu fanin-block fanin-replies fanin-onecore fanin-profile fanin-gpu-profile fanin-gpu-levels fanin-gpu-replies capture-stream fanin-gpu"

steps=(setup)  # always first: the environment every other step runs in
for arg in "${@:-all}"; do
    case $arg in
        all) steps+=(volume-start fanin-cpu fanin-profile fanin-block fanin-onecore volume-wait lost1 lost2 lost4 full13 full24 fanin-gpu) ;;
        A) steps+=(volume-start fanin-cpu fanin-profile) ;;
        B) steps+=(fanin-block fanin-onecore volume-wait) ;;
        C) steps+=(lost1 lost2) ;;
        D) steps+=(lost4 full13) ;;
        E) steps+=(full24 fanin-gpu) ;;
        setup) ;;
        lost1|lost2|lost3|lost4|full13|full24|full3|steady4|volume-start|volume-wait|accuracy-start|accuracy-wait|steady1|drift1|between1|launch1|budget-tests|gpu-tests|attached1|launch-session|fanin-cpu|fanin-block|fanin-replies|fanin-onecore|fanin-profile|fanin-gpu-profile|fanin-gpu-levels|fanin-gpu-replies|capture-stream|fanin-gpu)
            steps+=("$arg") ;;
        *) echo "gpu_session.sh: unknown step $arg (steps: $STEPS; groups: all A B C D E)" >&2; exit 2 ;;
    esac
done
session_begin
mkdir -p "$STATE"

# A long GPU run in its own process session (a device call kills what it leaves running, except
# such a one): background_start NAME COMMAND... returns at once; background_wait NAME, in a later
# call on the same warm machine, waits for it and keeps its log and $STATE/NAME*.json.
background_start() {
    local name=$1; shift
    echo "== $name-start: $*" >> "$RESULTS/$name-start.log"
    if [ -n "$DRY_RUN" ]; then note "-- $name-start: dry run"; return 0; fi
    if [ -f "$STATE/$name.pid" ] && [ ! -f "$STATE/$name.rc" ] && kill -0 "$(cat "$STATE/$name.pid")" 2>/dev/null; then
        note "-- $name-start: already running (pid $(cat "$STATE/$name.pid"))"; return 0
    fi
    rm -f "$STATE/$name".*
    # shellcheck disable=SC2016  # $0 and $$ are the inner shell's
    setsid nohup bash -c 'echo $$ > "$0.pid"; "$@"; echo $? > "$0.rc"' "$STATE/$name" "$@" \
        > "$STATE/$name.log" 2>&1 < /dev/null &
    sleep 2
    note "-- $name-start: pid $(cat "$STATE/$name.pid" 2>/dev/null || echo '?'): $*"
}

background_wait() {
    local name=$1 began=$SECONDS limit
    limit=$(cap 3600)
    echo "== $name-wait (up to ${limit}s)" >> "$RESULTS/$name-wait.log"
    if [ -n "$DRY_RUN" ]; then note "-- $name-wait: dry run (up to ${limit}s)"; return 0; fi
    if [ ! -f "$STATE/$name.pid" ]; then
        note "-- $name-wait: nothing was started on this machine ($name-start, in an earlier call on the same warm machine)"
        return 0
    fi
    while [ ! -f "$STATE/$name.rc" ] && kill -0 "$(cat "$STATE/$name.pid")" 2>/dev/null \
        && [ $((SECONDS - began)) -lt "$limit" ]; do
        sleep 5
    done
    cat "$STATE/$name.log" >> "$RESULTS/$name-wait.log"
    cp "$STATE/$name"*.json "$RESULTS/" 2>/dev/null
    if [ -f "$STATE/$name.rc" ]; then
        note "-- $name-wait: exited $(cat "$STATE/$name.rc") after $(( $(date +%s) - $(stat -c %Y "$STATE/$name.pid") ))s; waited $((SECONDS - began))s"
    elif kill -0 "$(cat "$STATE/$name.pid")" 2>/dev/null; then
        note "-- $name-wait: still running after ${limit}s of waiting: call $name-wait again (CPU-only steps meanwhile)"
    else
        note "-- $name-wait: the process is gone with no exit status"
    fi
}

volume_start() {
    local cmd=("$PY" bench/budget_accuracy.py --modes budget --workloads W4 --seconds "${VOLUME_SECONDS:-660}"
               --out "$STATE/volume.json")
    [ -n "$VOLUME_CPUS" ] && cmd=(taskset -c "$VOLUME_CPUS" "${cmd[@]}")
    background_start volume "${cmd[@]}"
}

# One 5-minute full run and one budget run per workload, each held to its rate (ACCURACY_RUNS:
# WORKLOAD:RATE words, one after the other, ~11 min each).
accuracy_start() {
    local chain="" run
    for run in ${ACCURACY_RUNS:-W4:50 W2:250 W5:250}; do
        chain+="$PY bench/budget_accuracy.py --workloads ${run%%:*} --rate ${run#*:} --seconds ${ACCURACY_SECONDS:-300} --out $STATE/accuracy_${run%%:*}.json; "
    done
    background_start accuracy bash -c "$chain"
}

summarize() {
    local name=$1
    case $name in
        lost[1234]) grep -E '^W[1234](:| session [0-9]+: )' "$RESULTS/$name.log" | tee -a "$SUMMARY" ;;
        full13|full24|full3) sed -n '/^wrote /,$p' "$RESULTS/$name.log" | tee -a "$SUMMARY" ;;
        steady4) tail -n 12 "$RESULTS/$name.log" | tee -a "$SUMMARY" ;;
        volume-wait) grep -E '^W4 ' "$RESULTS/volume-wait.log" | tee -a "$SUMMARY" ;;
        accuracy-wait) grep -E '^W[0-9]+[: ]' "$RESULTS/accuracy-wait.log" | tee -a "$SUMMARY" ;;
        steady1) tail -n 14 "$RESULTS/$name.log" | tee -a "$SUMMARY" ;;
        drift1) grep -E '^W1[: ]' "$RESULTS/$name.log" | tee -a "$SUMMARY" ;;
        between1) grep -E '^W1 ' "$RESULTS/$name.log" | tee -a "$SUMMARY" ;;
        launch1|launch-session) grep -E '^(launch|built) ' "$RESULTS/$name.log" | tee -a "$SUMMARY" ;;
        budget-tests|gpu-tests|attached1) grep -E '(PASSED|FAILED|ERROR|SKIPPED|passed|failed|^E )' "$RESULTS/$name.log" | head -60 | tee -a "$SUMMARY" ;;
        fanin-*) summarize_fanin "$RESULTS/$name.log" ;;
        capture-stream) grep -E '^\{' "$RESULTS/$name.log" | tee -a "$SUMMARY" ;;
    esac
}

full() {  # full13 / full24: overhead_gpu with its --budget inside the step's limit
    local name=$1 workloads=$2 lim
    lim=$(cap "$3")
    step "$name" "$lim" "$PY" bench/overhead_gpu.py --rounds "${FULL_ROUNDS:-5}" --workloads "$workloads" \
        --modes none,bare,cuptistream --seconds 2 --budget $((lim - 20)) --out "$RESULTS/full_$4.json"
    [ -f "$RESULTS/full_$4.json" ] && cp "$RESULTS/full_$4.json" "$STATE/"
    return 0
}

for s in "${steps[@]}"; do
    case $s in
        setup)
            setup || break ;;
        lost1|lost2|lost3|lost4)
            limits=([1]=265 [2]=285 [3]=285 [4]=285)
            step "$s" "${LOST_LIMIT:-${limits[${s#lost}]}}" "$PY" bench/budget_lost_time.py --workloads "W${s#lost}" \
                --sessions "${LOST_SESSIONS:-5}" --seconds "${LOST_SECONDS:-25}" --out "$RESULTS/lost_W${s#lost}.json" ;;
        full13)
            full full13 W1,W3 275 w13 ;;
        full24)
            full full24 W2,W4 390 w24
            if [ -f "$STATE/full_w13.json" ] && [ -f "$STATE/full_w24.json" ]; then
                "$PY" bench/overhead_gpu.py --merge "$STATE/full_w13.json" "$STATE/full_w24.json" \
                    --out "$RESULTS/full_merged.json" > "$RESULTS/full-merged.log" 2>&1
                note "-- full24: merged with full13's JSON into full_merged.json (full-merged.log)"
            fi ;;
        full3)
            lim=$(cap 320)
            # shellcheck disable=SC2046  # no variant: no words
            step full3 "$lim" "$PY" bench/overhead_gpu.py --rounds "${FULL3_ROUNDS:-6}" --workloads W3 \
                --modes none,bare,cuptistream $([ -n "${FULL3_VARIANT:-}" ] && echo --variant "$FULL3_VARIANT") \
                --seconds 2 --budget $((lim - 20)) --out "$RESULTS/full_w3.json" ;;
        steady4)
            step steady4 "$(cap 240)" "$PY" bench/steady_cost_gpu.py --workload W4 --configs none,configs/production.yaml \
                --rounds 3 --base 8 --seconds 14 --out "$RESULTS/steady_W4.json" ;;
        volume-start)
            volume_start ;;
        volume-wait)
            background_wait volume ;;
        accuracy-start)
            accuracy_start ;;
        accuracy-wait)
            background_wait accuracy ;;
        drift1)
            config=configs/production.yaml
            if [ -n "${DRIFT_BETWEEN:-}" ]; then  # production.yaml with another activity.between_windows
                config=$RESULTS/production-$DRIFT_BETWEEN.yaml
                sed -E "s/between_windows: [a-z]+/between_windows: $DRIFT_BETWEEN/" configs/production.yaml > "$config"
                grep -q "between_windows: $DRIFT_BETWEEN" "$config" || { note "-- drift1: no between_windows in production.yaml"; continue; }
            fi
            step drift1 "$(cap 480)" "$PY" bench/budget_lost_time.py --workloads W1 --sessions "${DRIFT_SESSIONS:-5}" \
                --seconds 25 --drift --config "$config" --out "$RESULTS/drift_W1.json" ;;
        between1)
            step between1 "$(cap 330)" "$PY" bench/between_windows.py --seconds "${BETWEEN_SECONDS:-60}" --phase 2 \
                --out "$RESULTS/between_W1.json" ;;
        launch1)
            step launch1 "$(cap 300)" "$PY" bench/launch_cost.py --out "$RESULTS/launch.json" ;;
        budget-tests)
            CUPTISTREAM_GPU_RESULTS=$RESULTS/gpu step budget-tests "$(cap 200)" "$PY" -m pytest -v -p no:cacheprovider \
                tests/gpu/test_budget_gpu.py ${BUDGET_TESTS_ARGS:-} ;;
        attached1)
            CUPTISTREAM_TEST_WORLD=1 CUPTISTREAM_GPU_RESULTS=$RESULTS/gpu step attached1 "$(cap 500)" "$PY" -m pytest -v \
                -p no:cacheprovider tests/gpu/test_detach_multigpu.py -k "${ATTACHED_K:-attached}" ;;
        gpu-tests)
            # shellcheck disable=SC2086  # GPU_TESTS is words (files, -k EXPR)
            CUPTISTREAM_GPU_RESULTS=$RESULTS/gpu step gpu-tests "$(cap 300)" "$PY" -m pytest -v -p no:cacheprovider \
                ${GPU_TESTS:-tests/gpu/test_activity_gpu.py -k per_thread} ;;
        launch-session)
            step launch-session "$(cap 200)" "$PY" bench/launch_cost.py --modes none \
                --session-rounds "${LAUNCH_ROUNDS:-3}" --out "$RESULTS/launch-session.json" ;;
        steady1)
            step steady1 "$(cap 420)" "$PY" bench/steady_cost_gpu.py --workload W1 --pin "${STEADY_PIN:-3}" \
                --configs none,bench/configs/state-only.yaml,bench/configs/windows-idle.yaml,configs/production.yaml \
                --rounds "${STEADY_ROUNDS:-3}" --base 6 --seconds 8 --out "$RESULTS/steady_W1.json" ;;
        fanin-cpu)
            # shellcheck disable=SC2086  # FANIN_EXTRA is words
            step fanin-cpu 360 "$PY" bench/fanin.py --mode cpu --probes "${FANIN_PROBES:-1,4,8,16}" \
                --seconds "${FANIN_SECONDS:-15}" --runs "${FANIN_RUNS:-3}" $FANIN_EXTRA --out "$RESULTS/fanin_cpu" ;;
        fanin-block)
            # shellcheck disable=SC2086
            step fanin-block 240 "$PY" bench/fanin.py --mode cpu --probes 16 --loops "${BLOCK_LOOPS:-1000}" \
                --full-policy block --runs "${BLOCK_RUNS:-1}" --replay-buffer-size "${BLOCK_BUFFER_SIZE:-4MiB}" \
                $FANIN_EXTRA --out "$RESULTS/fanin_block" ;;
        fanin-replies)
            for round in 1 2; do
                for replies in mapped shared; do
                    step "fanin-replies" "$(cap 100)" "$PY" bench/fanin.py --mode cpu --probes 16 --loops 500 \
                        --full-policy block --runs 1 --replay-buffer-size 4MiB --workers auto \
                        --worker-replies "$replies" --out "$RESULTS/fanin_replies_${replies}_$round"
                done
            done ;;
        fanin-onecore)
            step fanin-onecore 360 "$PY" bench/fanin.py --mode cpu --probes 1,4,8,16 --seconds 15 \
                --runs "${FANIN_RUNS:-3}" --workers 0 --collector-cpus 0 --program-cpus 1-15 --out "$RESULTS/fanin_onecore" ;;
        fanin-profile)
            if [ -z "$DRY_RUN" ] && ! command -v py-spy > /dev/null; then
                note "-- fanin-profile: SKIPPED, no py-spy (carry its wheel in .whl/)"
            else
                step fanin-profile "${FANIN_PROFILE_LIMIT:-90}" "$PY" bench/fanin.py --mode cpu \
                    --probes "${FANIN_PROFILE_PROBES:-4}" --seconds 12 --profile \
                    --profile-gil --no-check --out "$RESULTS/fanin_profile"
            fi ;;
        fanin-gpu-profile)
            if [ -z "$DRY_RUN" ] && ! command -v py-spy > /dev/null; then
                note "-- fanin-gpu-profile: SKIPPED, no py-spy (carry its wheel in .whl/)"
            else
                # shellcheck disable=SC2086  # FANIN_PROFILE_ARGS is words
                step fanin-gpu-profile 150 "$PY" bench/fanin.py --mode gpu --seconds 10 --profile --no-check \
                    ${FANIN_PROFILE_ARGS:---probes 1,4} --out "$RESULTS/fanin_gpu_profile"
                for p in "$RESULTS"/fanin_gpu_profile/*/profile.txt; do
                    [ -f "$p" ] && { note "$p:"; $PY bench/profile_stages.py "$p" | tee -a "$SUMMARY"; }
                done
            fi ;;
        fanin-gpu-levels)
            for round in 1 2; do
                for level in 3 1; do
                    # shellcheck disable=SC2086  # FANIN_EXTRA is words
                    step fanin-gpu-levels "$(cap 110)" "$PY" bench/fanin.py --mode gpu --probes 16 --seconds 15 --runs 1 \
                        --zstd-level "$level" $FANIN_EXTRA --out "$RESULTS/fanin_gpu_zstd${level}_$round"
                done
            done ;;
        fanin-gpu-replies)
            for round in 1 2; do
                for replies in mapped shared; do
                    # shellcheck disable=SC2086  # FANIN_EXTRA is words
                    step fanin-gpu-replies "$(cap 110)" "$PY" bench/fanin.py --mode gpu --probes 16 --seconds 15 \
                        --runs 1 --worker-replies "$replies" $FANIN_EXTRA --out "$RESULTS/fanin_gpu_${replies}_$round"
                done
            done ;;
        capture-stream)
            step capture-stream 90 "$PY" bench/capture_stream.py --workload W3 --seconds 0.2 \
                --out "$RESULTS/w3_stream.cupti" ;;
        fanin-gpu)
            # shellcheck disable=SC2086  # FANIN_EXTRA is words
            step fanin-gpu 170 "$PY" bench/fanin.py --mode gpu --probes "${FANIN_GPU_PROBES:-1,4,8,16}" --seconds 15 \
                --runs "${FANIN_GPU_RUNS:-1}" $FANIN_EXTRA --out "$RESULTS/fanin_gpu" ;;
    esac
    [ "$s" = setup ] || summarize "$s"
done
session_end
