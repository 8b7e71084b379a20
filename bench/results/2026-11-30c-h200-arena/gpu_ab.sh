# 16 GPU programs under auto, the arenas with the early let-go (new: the working tree, e9f5c36 and
# after) against a slot per reply (base: ab_base, c3ac23d), 3 interleaved pairs. Carry ab_base.
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 ab_base cuptistream > /dev/null 2>&1
R=/tmp/gab; rm -rf $R; mkdir -p $R
for r in 1 2 3; do for t in new base; do
  PP=$PYTHONPATH; if [ $t = base ]; then PP=$PWD/ab_base:$PYTHONPATH; fi
  PYTHONPATH=$PP timeout 70 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --no-check --out $R/gpu-$t-$r > $R/gpu-$t-$r.log 2>&1
  echo "gpu-$t $r $(grep '"probes"' $R/gpu-$t-$r.log | head -1)" >> $OUT/gpu_ab.txt
done; done
python3 bench/results/2026-11-30b-h200-runs/table.py $OUT/gpu_ab.txt
python3 bench/results/2026-11-30c-h200-arena/slots.py $R
cd $R && tar czf $OUT/gpu_ab.tar.gz --exclude='*.zst' .
