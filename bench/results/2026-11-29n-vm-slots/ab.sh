#!/bin/bash
# Interleaved A/B: base-head (3e4d890) against new-head (reply slots: resident first, periodic trim).
W3=/work/main/bench/results/2026-11-27f-h100/gpu-capture-stream/w3_stream.cupti
export PATH=/work/main/.venv/bin:$PATH
out=${OUT:-/tmp/abslots/out}; mkdir -p $out
for round in ${ROUNDS:-1 2}; do
  for code in base-head new-head; do
    for shape in ${SHAPES:-w3}; do
      extra=""; [ $shape = w3 ] && extra="--replay-path $W3"
      (cd /tmp/$code && PYTHONPATH=/tmp/$code python bench/fanin.py --mode cpu --probes ${PROBES:-4} --workers ${WORKERS:-2} --seconds 8 --runs 1 $extra --out $out/$round-$code-$shape > $out/$round-$code-$shape.log 2>&1)
      echo "$round $code $shape $(grep '^{' $out/$round-$code-$shape.log | head -1 | python -c 'import json,sys; r=json.loads(sys.stdin.read()); print("rec",r["records"], "steady/s",r["steady_delivered_events_per_s"], "cpu/M",r["cpu_s_per_m_records"], "steadycpu/M",r["steady_cpu_s_per_m_events"], "coll",r["collector_cpu_s"], "wk",r["workers_cpu_s"], "wfault/k",r["workers_faults_per_k_records"], "cfault/k", r["collector_faults_per_k_records"], r["check"]["in_equals_disk_plus_drops"])')"
    done
  done
done
