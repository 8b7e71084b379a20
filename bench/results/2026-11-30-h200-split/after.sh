# With the thread connection moving to a worker too (b5ac518): 16 GPU programs under `auto`, against
# `auto` of 1ac3602 (ab_base), interleaved, 3 rounds; then the block run (read back) and the
# overload pair (4 then 8 replay probes, 2 runs, checked). Run with ab_base carried.
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 ab_base cuptistream > /dev/null 2>&1
R=/tmp/after; rm -rf $R; mkdir -p $R
for r in 1 2 3; do for t in auto base; do
  PP=$PYTHONPATH; if [ $t = base ]; then PP=$PWD/ab_base:$PYTHONPATH; fi
  PYTHONPATH=$PP timeout 100 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --no-check --out $R/$t-$r > $R/$t-$r.log 2>&1
  echo "$t $r $(grep '"probes"' $R/$t-$r.log | head -1)" >> $OUT/after.txt
done; done
timeout 170 python3 bench/fanin.py --mode cpu --probes 16 --loops 700 --full-policy block --replay-buffer-size 4MiB --workers auto --runs 1 --out $R/block > $R/block.log 2>&1
grep '"probes"' $R/block.log | head -1 >> $OUT/after.txt
timeout 130 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 2 --workers auto --out $R/overload > $R/overload.log 2>&1
grep '"probes"' $R/overload.log | head -4 >> $OUT/after.txt
python3 - $OUT/after.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    tag, _, js = line.partition("{")
    d = json.loads("{" + js)
    c = d.get("check", {})
    print(tag.strip() or d["probes"], d["probes"], d["decode_workers_started"], d["decode_worker_moves"], d["delivered_events_per_s"], d["cpu_s_per_m_records"], d["collector_cpu_s"], d["workers_cpu_s"], d["peak_rss_anon_mib"], c.get("in_equals_disk_plus_drops"), c.get("disk_equals_captures_x_loops"), d.get("steady_delivered_events_per_s"), d["drops"], d["threads_cpu_s"].get("cuptistream-probe-conn"))
PY
cd $R && tar czf $OUT/after.tar.gz --exclude='*.zst' .
