# The walk by runs and pack_columns' one table (new: the working tree) against 316dc42 (base:
# ab_base), interleaved: walk_cost on W3's own 4 MiB buffers (one core, 5 rounds), 16 GPU programs
# under auto (3 pairs), the overload pair, 4 then 8 replay probes (2 pairs). Run with ab_base carried.
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 ab_base cuptistream > /dev/null 2>&1
R=/tmp/ab; rm -rf $R; mkdir -p $R
W3=bench/results/2026-11-27f-h100/gpu-capture-stream/w3_stream.cupti
taskset -c 3 python3 bench/walk_cost.py --rounds 5 --captures $W3 --against ab_base > $OUT/walk.txt 2>&1
for r in 1 2 3; do for t in new base; do
  PP=$PYTHONPATH; if [ $t = base ]; then PP=$PWD/ab_base:$PYTHONPATH; fi
  PYTHONPATH=$PP timeout 100 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --no-check --out $R/gpu-$t-$r > $R/gpu-$t-$r.log 2>&1
  echo "gpu-$t $r $(grep '"probes"' $R/gpu-$t-$r.log | head -1)" >> $OUT/ab.txt
done; done
for r in 1 2; do for t in new base; do
  PP=$PYTHONPATH; if [ $t = base ]; then PP=$PWD/ab_base:$PYTHONPATH; fi
  PYTHONPATH=$PP timeout 70 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 1 --workers auto --out $R/over-$t-$r > $R/over-$t-$r.log 2>&1
  grep '"probes"' $R/over-$t-$r.log | head -2 | sed "s/^/over-$t $r /" >> $OUT/ab.txt
done; done
python3 bench/results/2026-11-30b-h200-runs/table.py $OUT/ab.txt
cd $R && tar czf $OUT/ab.tar.gz --exclude='*.zst' .
