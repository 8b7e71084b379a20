# 16 GPU programs under one collector (W3's CUDA-graph replay, 15 s): `auto` as of this commit
# (workers follow the load: 8 connections a worker, a busy one splits), 2 decode workers, and `auto`
# of 1ac3602 (ab_base: a worker per 4 connections), interleaved, 3 rounds. Run with ab_base carried.
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 ab_base cuptistream > /dev/null 2>&1
R=/tmp/split; rm -rf $R; mkdir -p $R
for r in 1 2 3; do for t in auto two base; do
  PP=$PYTHONPATH; W=auto
  if [ $t = base ]; then PP=$PWD/ab_base:$PYTHONPATH; fi
  if [ $t = two ]; then W=2; fi
  PYTHONPATH=$PP timeout 100 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers $W --no-check --out $R/$t-$r > $R/$t-$r.log 2>&1
  echo "$t $r $(grep '"probes"' $R/$t-$r.log | head -1)" | tee -a $OUT/gpu.txt
done; done
cd $R && tar czf $OUT/gpu.tar.gz --exclude='*.zst' .
