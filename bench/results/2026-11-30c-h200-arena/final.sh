# At the arenas (14bbceb and after): 16 GPU programs under auto, twice (the first read back); the
# block run (16 replay probes, 4 MiB buffers, 700 loops, read back); the overload pair (4 then 8
# replay probes, auto, 10 s) unpinned, 2 more runs, checked (events in = on disk + counted drops).
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 cuptistream > /dev/null 2>&1
R=/tmp/final; rm -rf $R; mkdir -p $R
timeout 120 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --out $R/gpu > $R/gpu.log 2>&1
echo "gpu 1 $(grep '"probes"' $R/gpu.log | head -1)" >> $OUT/final.txt
timeout 100 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --no-check --out $R/gpu2 > $R/gpu2.log 2>&1
echo "gpu 2 $(grep '"probes"' $R/gpu2.log | head -1)" >> $OUT/final.txt
timeout 170 python3 bench/fanin.py --mode cpu --probes 16 --loops 700 --full-policy block --replay-buffer-size 4MiB --workers auto --runs 1 --out $R/block > $R/block.log 2>&1
echo "block 1 $(grep '"probes"' $R/block.log | head -1)" >> $OUT/final.txt
timeout 170 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 2 --workers auto --out $R/free > $R/free.log 2>&1
grep '"probes"' $R/free.log | sed "s/^/free 1 /" >> $OUT/final.txt
grep -i overload $R/free.log >> $OUT/final.txt
python3 bench/results/2026-11-30b-h200-runs/table.py $OUT/final.txt
python3 bench/results/2026-11-30c-h200-arena/slots.py $R
python3 - $OUT/final.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    tag, _, js = line.partition("{")
    d = json.loads("{" + js) if js.strip() else {}
    print(tag.strip()[:40], "steady", d.get("steady_delivered_events_per_s"), "check", d.get("check"), "shm", d.get("peak_rss_shmem_mib"))
PY
cd $R && tar czf $OUT/final.tar.gz --exclude='*.zst' .
