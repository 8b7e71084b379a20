# At 0b12697 (a worker's load counts from when it started up): 16 GPU programs under `auto`, 4 runs
# (the first read back), the block run (read back) and the overload pair once (4 then 8 probes).
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 cuptistream > /dev/null 2>&1
R=/tmp/final; rm -rf $R; mkdir -p $R
timeout 120 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --out $R/gpu-1 > $R/gpu-1.log 2>&1
echo "gpu 1 $(grep '"probes"' $R/gpu-1.log | head -1)" >> $OUT/final.txt
for r in 2 3 4; do
  timeout 60 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --no-check --out $R/gpu-$r > $R/gpu-$r.log 2>&1
  echo "gpu $r $(grep '"probes"' $R/gpu-$r.log | head -1)" >> $OUT/final.txt
done
timeout 100 python3 bench/fanin.py --mode cpu --probes 16 --loops 700 --full-policy block --replay-buffer-size 4MiB --workers auto --runs 1 --out $R/block > $R/block.log 2>&1
echo "block 1 $(grep '"probes"' $R/block.log | head -1)" >> $OUT/final.txt
timeout 70 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 1 --workers auto --out $R/overload > $R/overload.log 2>&1
grep '"probes"' $R/overload.log | head -2 | sed 's/^/overload 1 /' >> $OUT/final.txt
python3 - $OUT/final.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    tag, _, js = line.partition("{")
    try: d = json.loads("{" + js)
    except Exception: print(tag, "no result"); continue
    c = d.get("check", {})
    print(tag.strip(), d["probes"], d["decode_workers_started"], d["decode_worker_moves"], d["delivered_events_per_s"], d.get("steady_delivered_events_per_s"), d["cpu_s_per_m_records"], d["collector_cpu_s"], d["workers_cpu_s"], d["peak_rss_anon_mib"], c.get("in_equals_disk_plus_drops"), c.get("disk_equals_captures_x_loops"), d["drops"], d["shed_records"])
PY
cd $R && tar czf $OUT/final.tar.gz --exclude='*.zst' .
