#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/cuptistream.sh): the pair of prolog.sh. When
# the last job that the prolog counted on this node ends, stop the node collector (SIGTERM: it
# drains what the probes handed over, within pipeline.shutdown_deadline) and remove the node config
# the prolog wrote, so that processes started outside jobs stay untouched.
set -euo pipefail

NODE_CONFIG=${CUPTISTREAM_NODE_CONFIG:-/etc/cuptistream/node.yaml}
STATE=${CUPTISTREAM_STATE_DIR:-/run/cuptistream}
JOB=${SLURM_JOB_ID:?the epilog runs under slurmd, which sets SLURM_JOB_ID}

[ -d "$STATE/jobs" ] || exit 0
exec 9>"$STATE/lock"
flock 9
rm -f "$STATE/jobs/$JOB"
if [ -n "$(ls -A "$STATE/jobs")" ]; then
    exit 0  # other jobs on this node still use it
fi
if [ -e "$STATE/wrote-node-config" ]; then
    rm -f "$NODE_CONFIG" "$STATE/wrote-node-config"
fi
pid=$(cat "$STATE/collector.pid" 2>/dev/null || true)
if [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; then
    for _ in $(seq 600); do  # up to 60 s: the shutdown deadline, with room
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
fi
rm -f "$STATE/collector.pid"
exit 0
