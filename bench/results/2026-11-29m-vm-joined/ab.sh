#!/bin/bash
# Interleaved A/B of the collector: base (aeb7fbd) against joined decodes (HEAD), 2-core VM.
W3=/work/main/bench/results/2026-11-27f-h100/gpu-capture-stream/w3_stream.cupti
export PATH=/work/main/.venv/bin:$PATH
out=${OUT:-/tmp/ab}; rm -rf $out; mkdir -p $out
for round in 1 2 3; do
  for code in base-aeb new-head; do
    for shape in captured w3; do
      extra=""; [ $shape = w3 ] && extra="--replay-path $W3"
      (cd /tmp/$code && PYTHONPATH=/tmp/$code python bench/fanin.py --mode cpu --probes 2 --workers 1 --seconds 8 --runs 1 $extra --out $out/$round-$code-$shape > $out/$round-$code-$shape.log 2>&1)
      echo "$round $code $shape $(grep '^{' $out/$round-$code-$shape.log | head -1 | python -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["records"], r["steady_delivered_events_per_s"], r["cpu_s_per_m_records"], r["steady_cpu_s_per_m_events"], r["collector_cpu_s"], r["workers_cpu_s"], r["check"]["in_equals_disk_plus_drops"])')"
    done
  done
done
