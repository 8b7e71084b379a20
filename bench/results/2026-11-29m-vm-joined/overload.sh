#!/bin/bash
# Interleaved: 1 and 2 replay probes (captures' own buffers), in-thread decoding on one core, base vs new.
export PATH=/work/main/.venv/bin:$PATH
out=${OUT:-/tmp/ov}; rm -rf $out; mkdir -p $out
for round in 1 2; do
  for code in base-aeb new-head; do
      (cd /tmp/$code && PYTHONPATH=/tmp/$code python bench/fanin.py --mode cpu --probes 1,2 --workers 0 --collector-cpus 0 --program-cpus 1 --seconds 8 --runs 1 --out $out/$round-$code > $out/$round-$code.log 2>&1)
      grep '^{' $out/$round-$code.log | python -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(sys.argv[1], sys.argv[2], r["probes"], r["steady_delivered_events_per_s"], r["shed_records"], r["cpu_s_per_m_records"], r["check"]["in_equals_disk_plus_drops"])' $round $code
  done
done
