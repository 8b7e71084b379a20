# The CPU side of issue 30 with workers that follow the load (`auto`): the block run (16 replay
# probes of W3's 4 MiB buffers, 700 loops, every record read back), the overload pair (4 then 8
# replay probes, 2 runs), then W2 in full mode against bare CUPTI over 5 rounds.
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 cuptistream > /dev/null 2>&1
R=/tmp/cpu; rm -rf $R; mkdir -p $R
timeout 170 python3 bench/fanin.py --mode cpu --probes 16 --loops 700 --full-policy block --replay-buffer-size 4MiB --workers auto --runs 1 --out $R/block > $R/block.log 2>&1
grep '"probes"' $R/block.log | tee -a $OUT/cpu.txt; tail -2 $R/block.log
timeout 130 python3 bench/fanin.py --mode cpu --probes 4,8 --seconds 10 --runs 2 --workers auto --out $R/overload > $R/overload.log 2>&1
grep '"probes"\|overload\|ratio' $R/overload.log | tee -a $OUT/cpu.txt; tail -4 $R/overload.log
timeout 250 python3 bench/overhead_gpu.py --rounds 5 --workloads W2 --modes none,bare,cuptistream --seconds 2 --budget 230 --out $R/full_w2.json > $R/full_w2.log 2>&1
tail -15 $R/full_w2.log | tee -a $OUT/cpu.txt
cd $R && tar czf $OUT/cpu.tar.gz --exclude='*.zst' .
