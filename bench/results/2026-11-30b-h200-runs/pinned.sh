# The overload pair (4 then 8 replay probes, auto, 10 s) with the collector and its workers on
# cores 0-7 and the replaying programs on 8-15, 3 runs interleaved; the same pair unpinned, 2 runs;
# then 16 GPU programs under auto, 3 runs (the working tree only).
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 cuptistream > /dev/null 2>&1
R=/tmp/pin; rm -rf $R; mkdir -p $R
timeout 150 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 3 --workers auto --collector-cpus 0-7 --program-cpus 8-15 --out $R/pinned > $R/pinned.log 2>&1
grep '"probes"' $R/pinned.log | sed "s/^/pinned 1 /" >> $OUT/pinned.txt
timeout 100 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 2 --workers auto --out $R/free > $R/free.log 2>&1
grep '"probes"' $R/free.log | sed "s/^/free 1 /" >> $OUT/pinned.txt
for r in 1 2 3; do
  timeout 100 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --no-check --out $R/gpu-$r > $R/gpu-$r.log 2>&1
  echo "gpu $r $(grep '"probes"' $R/gpu-$r.log | head -1)" >> $OUT/pinned.txt
done
python3 bench/results/2026-11-30b-h200-runs/table.py $OUT/pinned.txt
cd $R && tar czf $OUT/pinned.tar.gz --exclude='*.zst' .
