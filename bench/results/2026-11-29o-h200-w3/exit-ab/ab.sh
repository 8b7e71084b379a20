bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 ab_base > /dev/null 2>&1
mkdir -p /tmp/ab
for r in 1 2; do for t in base new; do
  if [ $t = base ]; then PP=$PWD/ab_base:$PYTHONPATH; else PP=$PYTHONPATH; fi
  PYTHONPATH=$PP timeout 150 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --out /tmp/ab/$t-$r > /tmp/ab/$t-$r.log 2>&1
  echo "$t $r $(grep '"probes"' /tmp/ab/$t-$r.log | head -1)" | tee -a $OUT/ab.txt
done; done
cd /tmp/ab && tar czf $OUT/ab.tar.gz --exclude='*.zst' . 
