# More overload pairs at the walk by runs: pinned apart (collector 0-7, programs 8-15), 3 runs, then
# unpinned, 2 runs; each result line written as it comes.
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
R=/tmp/more; rm -rf $R; mkdir -p $R
for r in 1 2 3; do
  timeout 60 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 1 --workers auto --collector-cpus 0-7 --program-cpus 8-15 --no-check --out $R/pinned-$r > $R/pinned-$r.log 2>&1
  grep '"probes"' $R/pinned-$r.log | sed "s/^/pinned $r /" >> $OUT/more.txt
done
for r in 1 2; do
  timeout 60 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 1 --workers auto --no-check --out $R/free-$r > $R/free-$r.log 2>&1
  grep '"probes"' $R/free-$r.log | sed "s/^/free $r /" >> $OUT/more.txt
done
python3 bench/results/2026-11-30b-h200-runs/table.py $OUT/more.txt
