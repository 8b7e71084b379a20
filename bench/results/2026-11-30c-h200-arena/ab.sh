# Reply slots as arenas, a link's replies packed one after another into one slot (new: the working
# tree) against a slot per reply (base: ab_base, c3ac23d), interleaved: the overload pair, 4 then 8
# replay probes (3 pairs, unpinned); then 16 GPU programs under auto (new, once). Carry ab_base.
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 ab_base cuptistream > /dev/null 2>&1
R=/tmp/ab; rm -rf $R; mkdir -p $R
for r in 1 2 3; do for t in new base; do
  PP=$PYTHONPATH; if [ $t = base ]; then PP=$PWD/ab_base:$PYTHONPATH; fi
  PYTHONPATH=$PP timeout 80 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 1 --workers auto --out $R/over-$t-$r > $R/over-$t-$r.log 2>&1
  grep '"probes"' $R/over-$t-$r.log | head -2 | sed "s/^/over-$t $r /" >> $OUT/ab.txt
done; done
timeout 100 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --no-check --out $R/gpu-new-1 > $R/gpu-new-1.log 2>&1
echo "gpu-new 1 $(grep '"probes"' $R/gpu-new-1.log | head -1)" >> $OUT/ab.txt
python3 bench/results/2026-11-30b-h200-runs/table.py $OUT/ab.txt
python3 bench/results/2026-11-30c-h200-arena/slots.py $R
cd $R && tar czf $OUT/ab.tar.gz --exclude='*.zst' .
