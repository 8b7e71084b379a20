#!/bin/bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/prolog.d/cuptistream.sh, runs as root on each node of
# a job before it starts): make sure the node collector runs and the start hook is on, so that
# every hooked Python process of the job is probed. For nodes without the systemd unit
# (deploy/systemd); the first job on a node starts the collector, the epilog of the last one stops it.
# Jobs keep their identity: SLURM_JOB_ID, ranks and the like come from each process's environment.
set -euo pipefail

CUPTISTREAM=${CUPTISTREAM:-/opt/cuptistream/venv/bin/cuptistream}
CONFIG=${CUPTISTREAM_COLLECTOR_CONFIG:-/etc/cuptistream/collector.yaml}
NODE_CONFIG=${CUPTISTREAM_NODE_CONFIG:-/etc/cuptistream/node.yaml}
STATE=${CUPTISTREAM_STATE_DIR:-/run/cuptistream}
SOCKET=$STATE/collector.sock
JOB=${SLURM_JOB_ID:?the prolog runs under slurmd, which sets SLURM_JOB_ID}

mkdir -p "$STATE/jobs"
chmod 0755 "$STATE"
exec 9>"$STATE/lock"
flock 9  # one prolog or epilog at a time on this node
touch "$STATE/jobs/$JOB"

pid=$(cat "$STATE/collector.pid" 2>/dev/null || true)
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    setsid "$CUPTISTREAM" collector -c "$CONFIG" --socket "$SOCKET" --socket-mode 0666 --quiet \
        >>"$STATE/collector.log" 2>&1 </dev/null 9>&- &
    echo $! >"$STATE/collector.pid"
    for _ in $(seq 100); do  # up to 10 s for it to listen
        grep -q "^listening on" "$STATE/collector.log" 2>/dev/null && [ -S "$SOCKET" ] && break
        sleep 0.1
    done
fi

if [ ! -e "$NODE_CONFIG" ]; then
    mkdir -p "$(dirname "$NODE_CONFIG")"
    printf 'collector: %s\nconfig: %s\nstart: cuda\n' "$SOCKET" "$CONFIG" >"$NODE_CONFIG.tmp"
    mv "$NODE_CONFIG.tmp" "$NODE_CONFIG"
    touch "$STATE/wrote-node-config"  # ours to remove in the last epilog
fi
# A problem is logged, never fatal: a failing prolog would drain the node, and telemetry never stops a job.
"$CUPTISTREAM" node status >>"$STATE/collector.log" 2>&1 || echo "cuptistream: node status reported a problem, see $STATE/collector.log" >&2
exit 0
