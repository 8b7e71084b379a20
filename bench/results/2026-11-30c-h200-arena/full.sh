# Full mode (default.yaml) against bare CUPTI, W1-W4, 3 rounds, at the arenas: the item's
# re-measure at the end (the probe's path is as at c3ac23d).
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 cuptistream > /dev/null 2>&1
R=/tmp/full; rm -rf $R; mkdir -p $R
timeout 290 python3 bench/overhead_gpu.py --rounds 3 --workloads W1,W2,W3,W4 --modes bare,cuptistream --seconds 2 --budget 270 --out $R/full.json > $R/full.log 2>&1
tail -20 $R/full.log | tee $OUT/full.txt
cp $R/full.json $OUT/ 2>/dev/null
