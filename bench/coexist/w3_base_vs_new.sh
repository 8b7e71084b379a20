#!/usr/bin/env bash
# W3 (CUDA-graph replay) overhead, the code before the coexistence hooks (f27e6b1, /tmp/basesite)
# against the current code (/tmp/site), alternating one bench round each, N times.
N=${N:-4}; OUTDIR=${1:-/tmp/w3}; mkdir -p $OUTDIR
for i in $(seq 1 $N); do
  for v in base new; do
    site=/tmp/site; [ $v = base ] && site=/tmp/basesite
    PYTHONPATH=$site python3 bench/overhead_gpu.py --rounds 1 --workloads W3 --modes none,bare,cuptistream \
      --budget 100 --out $OUTDIR/w3_${v}_$i.json > /dev/null 2>&1 || echo "round $i $v failed"
  done
done
python3 - $OUTDIR <<'PY'
import json, sys, glob, statistics
for v in ("base", "new"):
    ratios = []
    for f in sorted(glob.glob(f"{sys.argv[1]}/w3_{v}_*.json")):
        d = json.load(open(f))
        t = {r["mode"]: r["result"]["per_iteration_us"] for r in d["runs"] if r.get("ok") and r["workload"] == "W3"}
        if "cuptistream" in t and "bare" in t:
            ratios.append(t["cuptistream"] / t["bare"])
    if ratios:
        print(f"{v}: cuptistream/bare median {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] over {len(ratios)} rounds: {[round(r, 2) for r in ratios]}")
    else:
        print(f"{v}: no ratios parsed; keys of one file:", list(json.load(open(sorted(glob.glob(f'{sys.argv[1]}/w3_{v}_*.json'))[0])).keys()))
PY
