#!/bin/bash
W=/work/main/bench/results/2026-11-27f-h100/gpu-capture-stream/w3_stream.cupti
for r in 1 2 3; do for t in new base; do
  out=/tmp/abb/$t-$r; rm -rf $out
  PYTHONPATH=/tmp/$t-head PATH=/work/main/.venv/bin:$PATH python /tmp/$t-head/bench/fanin.py --mode cpu --probes 4 --seconds 8 --replay-path $W --no-check --out $out 2>&1 | grep '"probes"' | python3 -c "
import json,sys; d=json.loads(sys.stdin.read()); print('$t', d['decode_workers_started'], d['records'], d['collector_cpu_s'], d['workers_cpu_s'], d['cpu_s_per_m_records'], d['threads_cpu_s'].get('(native threads)'))"
done; done
