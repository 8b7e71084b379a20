# The arena code (the working tree): the overload pair pinned (collector and workers on cores 0-7,
# the replaying programs on 8-15), 3 runs; then GIL-only py-spy profiles of 4 and of 8 replay probes.
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 cuptistream > /dev/null 2>&1
R=/tmp/prof; rm -rf $R; mkdir -p $R
timeout 200 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 3 --workers auto --collector-cpus 0-7 --program-cpus 8-15 --out $R/pinned > $R/pinned.log 2>&1
grep '"probes"' $R/pinned.log | sed "s/^/pinned 1 /" >> $OUT/prof.txt
grep -i overload $R/pinned.log >> $OUT/prof.txt
for n in 4 8; do
  timeout 80 python3 bench/fanin.py --mode cpu --probes $n --seconds 10 --workers auto --no-check --profile --profile-gil --out $R/gil$n > $R/gil$n.log 2>&1
  grep '"probes"' $R/gil$n.log | sed "s/^/gil$n 1 /" >> $OUT/prof.txt
done
python3 bench/results/2026-11-30b-h200-runs/table.py $OUT/prof.txt
python3 bench/results/2026-11-30c-h200-arena/slots.py $R
cd $R && tar czf $OUT/prof.tar.gz --exclude='*.zst' .
