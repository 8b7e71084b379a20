# 16 GPU programs under one collector (decode_workers auto), the BLAS change (new) against 1a940ce
# (base: numpy's OpenBLAS starts one thread per core in the collector and each worker), 3 pairs.
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 ab_base > /dev/null 2>&1
mkdir -p /tmp/ab
for r in 1 2 3; do for t in new base; do
  if [ $t = base ]; then PP=$PWD/ab_base:$PYTHONPATH; else PP=$PYTHONPATH; fi
  PYTHONPATH=$PP timeout 120 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --no-check --out /tmp/ab/$t-$r > /tmp/ab/$t-$r.log 2>&1
  echo "$t $r $(grep '"probes"' /tmp/ab/$t-$r.log | head -1)" | tee -a $OUT/ab.txt
done; done
cd /tmp/ab && tar czf $OUT/ab.tar.gz --exclude='*.zst' .
