# Issue 30 with columns in the file sink (the working tree): 16 GPU programs under `auto` and with
# 2 decode workers (2 runs each, interleaved), the block run (16 replay probes of W3's 4 MiB
# buffers, every record read back), and the overload pair (4 then 8 replay probes, 2 runs).
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 cuptistream > /dev/null 2>&1
R=/tmp/final; rm -rf $R; mkdir -p $R
timeout 200 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto,2 --runs 2 --no-check --out $R/gpu > $R/gpu.log 2>&1
grep '"probes"' $R/gpu.log | tee -a $OUT/final.txt
timeout 200 python3 bench/fanin.py --mode cpu --probes 16 --loops 700 --full-policy block --replay-buffer-size 4MiB --workers auto --runs 1 --out $R/block > $R/block.log 2>&1
grep '"probes"' $R/block.log | tee -a $OUT/final.txt; tail -2 $R/block.log
timeout 150 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 2 --workers auto --out $R/overload > $R/overload.log 2>&1
grep '"probes"\|overload\|ratio' $R/overload.log | tee -a $OUT/final.txt; tail -4 $R/overload.log
cd $R && tar czf $OUT/final.tar.gz --exclude='*.zst' .
