# 16 GPU programs under one collector (decode_workers auto): the columnar file layout and the run
# walk (new: the working tree) against the commit before them (base: ab_base, the code of 8cc12f5),
# 3 pairs, then one checked run of new (every record read back from disk).
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 ab_base cuptistream > /dev/null 2>&1
mkdir -p /tmp/abc
for r in 1 2 3; do for t in new base; do
  if [ $t = base ]; then PP=$PWD/ab_base:$PYTHONPATH; else PP=$PYTHONPATH; fi
  PYTHONPATH=$PP timeout 120 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --no-check --out /tmp/abc/$t-$r > /tmp/abc/$t-$r.log 2>&1
  echo "$t $r $(grep '"probes"' /tmp/abc/$t-$r.log | head -1)" | tee -a $OUT/ab.txt
done; done
timeout 150 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --out /tmp/abc/checked > /tmp/abc/checked.log 2>&1
echo "checked $(grep '"probes"' /tmp/abc/checked.log | head -1)" | tee -a $OUT/ab.txt
tail -3 /tmp/abc/checked.log
cd /tmp/abc && tar czf $OUT/ab.tar.gz --exclude='*.zst' .
