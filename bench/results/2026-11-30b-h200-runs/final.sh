# At the walk by runs (0a9cd77 and after): 16 GPU programs under auto, read back; the block run
# (16 replay probes of W3's 4 MiB buffers, 700 loops, read back); the overload pair (4 then 8 replay
# probes, auto, 10 s) with the collector on cores 0-7 and the programs on 8-15, 3 runs, then
# unpinned, 2 runs; every run checked (events in = on disk + counted drops).
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 cuptistream > /dev/null 2>&1
R=/tmp/final; rm -rf $R; mkdir -p $R
timeout 120 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --out $R/gpu > $R/gpu.log 2>&1
echo "gpu 1 $(grep '"probes"' $R/gpu.log | head -1)" >> $OUT/final.txt
timeout 170 python3 bench/fanin.py --mode cpu --probes 16 --loops 700 --full-policy block --replay-buffer-size 4MiB --workers auto --runs 1 --out $R/block > $R/block.log 2>&1
echo "block 1 $(grep '"probes"' $R/block.log | head -1)" >> $OUT/final.txt
timeout 250 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 3 --workers auto --collector-cpus 0-7 --program-cpus 8-15 --out $R/pinned > $R/pinned.log 2>&1
grep '"probes"' $R/pinned.log | sed "s/^/pinned 1 /" >> $OUT/final.txt
timeout 170 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 2 --workers auto --out $R/free > $R/free.log 2>&1
grep '"probes"' $R/free.log | sed "s/^/free 1 /" >> $OUT/final.txt
python3 bench/results/2026-11-30b-h200-runs/table.py $OUT/final.txt
python3 - $OUT/final.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    tag, _, js = line.partition("{")
    d = json.loads("{" + js) if js else {}
    print(tag.strip(), "steady", d.get("steady_delivered_events_per_s"), "check", d.get("check"))
PY
cd $R && tar czf $OUT/final.tar.gz --exclude='*.zst' .
