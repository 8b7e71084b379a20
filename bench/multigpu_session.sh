#!/usr/bin/env bash
# Issue 32's multi-GPU runs, for a host with 2-4 GPUs (nvidia-h200-x2 / nvidia-h100-x2 or larger).
# Ran on 2 x H100 (A, B, C) and 4 x H100 (B) on 2026-11-27: docs/gpu-validation.md, "Multi-GPU runs".
#
#   bash bench/multigpu_session.sh [STEP|GROUP ...]      # default: all, in the order below
#
# Assumes torch with CUDA and NCCL (the lent hosts' python3), and cuptistream's dependencies in $SITE
# (default /tmp/site): wheels carried in .whl/ or .gpuwheels/ are installed there first (a machine
# that was given back between calls comes fresh). The checkout's code runs, not a wheel's:
# tests/gpu/entry_points.py links sources/ and sinks/ into cuptistream/ and writes the entry points
# into /tmp/shim, and PYTHONPATH is $PWD:/tmp/shim:$SITE, so a stale wheel cannot shadow this branch.
#
# Results go to $RESULTS (default /tmp/multigpu-<steps>), one log per step; at the end one tarball
# of it, $OUT/multigpu-<steps>.tar.gz, and the compact summary, $OUT/summary-<steps>.txt (two files
# back per device call; without $OUT both stay in /tmp), and the summary on stdout. Recordings are
# not kept. The plumbing (wheels, entry points, env.txt, `step`, the tarball) is bench/device_lib.sh,
# shared with bench/gpu_session.sh; its header lists the variables it reads (DRY_RUN=1 MIN_GPUS=0: a
# dry run of the plumbing with no GPU, CALL_LIMIT: the call's seconds, which cut a step's limit).
#
# Steps, with their expected wall time on 2 x H100/H200 (16+ cores) and the hard limit each runs
# under (`timeout`, seconds; a step past it is cut, what it wrote is kept, the next step runs):
#
#   step      expected  limit  what
#   setup     ~0.3 min     -   GPUs, versions, entry points; stops the script below 2 GPUs
#   lost      ~5.5 min   420   always-on cost under DDP: bench/budget_lost_time.py --ddp 2 --workloads
#                              D1, 5 sessions x (~15 s torchrun + NCCL start, 2 s warm-up, 12 s base,
#                              1 s settle, 30 s timed, ~5 s stop); each session kept as it ends.
#                              LOST_SESSIONS, LOST_SECONDS, LOST_BASE, LOST_LIMIT change them (a null
#                              that does not resolve wants longer sessions: e.g. 4 x 60 s in a call of its
#                              own); LOST_DRIFT=1 adds --drift (a no-session run after each session:
#                              with LOST_BASE=40 LOST_SECONDS=40 a session and its run take ~3 min on
#                              2 x H100, so LOST_SESSIONS=3 fits LOST_LIMIT=580; 4 were cut, 2026-11-27)
#   node      ~0.7 min   120   a node collector (`cuptistream collector --socket`) in front of a 2-rank
#                              torchrun job (2,000 DDP steps, ~10 s): bench/fanin.py --mode ddp
#   compare   ~7.5 min   560   tests/gpu/test_compare_multigpu.py: 2 modes x (clean, 5, 10, 20 %);
#                              20 s (full) or 40 s (always-on) per job + ~20 s start, compare, export
#   compare2  ~6.5 min   560   the same on the first 2 GPUs only (CUDA_VISIBLE_DEVICES=0,1): two ranks,
#                              judged as a pair; for a host of 3 or more GPUs, where `compare` runs 4
#   coexist   ~1.5 min   140   tests/gpu/test_coexist_multigpu.py: 3 torchrun jobs of ~25 s
#   detach    ~8   min   590   tests/gpu/test_detach_multigpu.py: a 2-rank DDP job under budget windows that
#                              detach CUPTI (between_windows: detach) while NCCL's threads call CUDA (~40 s),
#                              then ~330 windows per rank at a 25 % budget, detached (~105 s) and attached
#                              (~105 s) twice: CUPTI 13's per-thread buffers, then one shared set
#                              (per_thread_buffers: false), and attached with windows of every kind
#                              (~105 s, the API kinds toggled too). Two lost-time sessions of 15 lost a rank to
#                              SIGSEGV on a native thread, with CUPTI attached (2026-11-28).
#                              DETACH_TESTS picks tests (node ids); on ONE GPU, CUPTISTREAM_TEST_WORLD=1
#                              MIN_GPUS=1 runs the same job as one rank (it reproduced the attached crash)
#   accuracy  ~3   min   230   NCCL statistics, production.yaml against full mode:
#                              bench/budget_accuracy.py --ddp 2 --workloads D1 --seconds 60
#   fanin     ~2   min   200   one collector, programs spread over the GPUs: bench/fanin.py --mode gpu
#                              --probes G,8G --seconds 6 (1, then 8 per GPU); most of it is reading
#                              back what W3 recorded (~0.8 M kernels/s per program)
#
# In all ~21 min of steps. One device call runs at most 10 minutes, so three calls on the same warm
# machine, each returning its own tarball and summary; each group's limits add up to under 10 min:
#
#   bash bench/multigpu_session.sh A     # setup lost node                (~6.5 min; limits 540 s)
#   bash bench/multigpu_session.sh B     # setup compare                  (~7.5 min; limits 560 s)
#   bash bench/multigpu_session.sh C     # setup coexist accuracy fanin   (~6.5 min; limits 570 s)
#   bash bench/multigpu_session.sh B2    # setup compare2 (4-GPU hosts)   (~6.5 min; limits 560 s)
#
# (`all` runs the six steps in one go, ~21 min: for a machine without a per-call limit, or started in
# the background with nohup and collected by a later call.)
set -u
# NVLink multicast stays off on the lent hosts (a program that uses it can take the host's shared GPUs
# out of service); every bench and test below passes its environment on to what it starts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SESSION=multigpu MIN_GPUS_DEFAULT=2 GPUS_WHY="issue 32's runs need 2 or more"
# `all` is not one device call: no call limit (device_lib.sh's CALL_LIMIT) unless one is given
[ $# -eq 0 ] || [[ " $* " == *" all "* ]] && CALL_LIMIT=${CALL_LIMIT:-100000}
# shellcheck source=bench/device_lib.sh
source "$(dirname "$0")/device_lib.sh"

steps=(setup)  # always first: the environment every other step runs in
for arg in "${@:-all}"; do
    case $arg in
        all) steps+=(lost node compare coexist accuracy fanin) ;;
        A) steps+=(lost node) ;;
        B) steps+=(compare) ;;
        B2) steps+=(compare2) ;;
        C) steps+=(coexist accuracy fanin) ;;
        setup) ;;
        lost|node|compare|compare2|coexist|detach|accuracy|fanin) steps+=("$arg") ;;
        *) echo "multigpu_session.sh: unknown step $arg (steps: setup lost node compare compare2 coexist detach accuracy fanin; groups: all A B C B2)" >&2; exit 2 ;;
    esac
done
session_begin

summarize() {
    local name=$1
    case $name in
        lost) grep -E '^D1 (rank [0-9]+ (\(|between)|(no )?session [0-9]+( rank [0-9]+)?: )' "$RESULTS/lost.log" | tee -a "$SUMMARY" ;;
        node|fanin) summarize_fanin "$RESULTS/$name.log" ;;
        compare|compare2|coexist|detach) grep -E '^(FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed|skipped)' "$RESULTS/$name.log" | tail -12 | tee -a "$SUMMARY" ;;
        accuracy) grep -E '^D1' "$RESULTS/accuracy.log" | tee -a "$SUMMARY" ;;
    esac
}

for s in "${steps[@]}"; do
    case $s in
        setup)
            setup || break ;;
        lost)
            step lost "${LOST_LIMIT:-420}" $PY bench/budget_lost_time.py --ddp 2 --workloads D1 \
                --sessions "${LOST_SESSIONS:-5}" --seconds "${LOST_SECONDS:-30}" --base "${LOST_BASE:-12}" \
                ${LOST_DRIFT:+--drift} --out "$RESULTS/lost_time_ddp.json" ;;
        node)
            step node 120 $PY bench/fanin.py --mode ddp --nproc 2 --steps 2000 --out "$RESULTS/node" ;;
        compare)
            CUPTISTREAM_GPU_RESULTS=$RESULTS/gpu step compare 560 $PY -m pytest -v -p no:cacheprovider \
                tests/gpu/test_compare_multigpu.py --junitxml "$RESULTS/compare.xml" ;;
        compare2)
            CUDA_VISIBLE_DEVICES=0,1 CUPTISTREAM_GPU_RESULTS=$RESULTS/gpu2 step compare2 560 $PY -m pytest -v \
                -p no:cacheprovider tests/gpu/test_compare_multigpu.py --junitxml "$RESULTS/compare2.xml" ;;
        coexist)
            CUPTISTREAM_GPU_RESULTS=$RESULTS/gpu step coexist 140 $PY -m pytest -v -p no:cacheprovider \
                tests/gpu/test_coexist_multigpu.py --junitxml "$RESULTS/coexist.xml" ;;
        detach)
            # shellcheck disable=SC2086  # DETACH_TESTS is words (files or node ids)
            CUPTISTREAM_GPU_RESULTS=$RESULTS/gpu step detach 590 $PY -m pytest -v -p no:cacheprovider \
                ${DETACH_TESTS:-tests/gpu/test_detach_multigpu.py} ;;
        accuracy)
            step accuracy 230 $PY bench/budget_accuracy.py --ddp 2 --workloads D1 --seconds 60 \
                --out "$RESULTS/accuracy_ddp.json" ;;
        fanin)
            step fanin 200 $PY bench/fanin.py --mode gpu --probes "$GPUS,$((8 * GPUS))" --seconds 6 --runs 1 \
                --out "$RESULTS/fanin_gpu" ;;
    esac
    [ "$s" = setup ] || summarize "$s"
done
session_end
