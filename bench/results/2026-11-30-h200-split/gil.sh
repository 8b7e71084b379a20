# The collector's GIL switch interval: 0.5 ms (new: the working tree) against Python's 5 ms (base:
# ab_base, e1e058c), interleaved: the overload pair's 8 replay probes (3 pairs, 10 s) and 16 GPU
# programs under auto (2 pairs); then a GIL-only py-spy profile of 8 replay probes (new).
bash bench/gpu_session.sh setup > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/shim:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 0 ab_base cuptistream > /dev/null 2>&1
R=/tmp/gil; rm -rf $R; mkdir -p $R
for r in 1 2 3; do for t in new base; do
  PP=$PYTHONPATH; if [ $t = base ]; then PP=$PWD/ab_base:$PYTHONPATH; fi
  PYTHONPATH=$PP timeout 60 python3 bench/fanin.py --mode cpu --probes 8 --seconds 10 --workers auto --out $R/cpu8-$t-$r > $R/cpu8-$t-$r.log 2>&1
  echo "cpu8-$t $r $(grep '"probes"' $R/cpu8-$t-$r.log | head -1)" >> $OUT/gil.txt
done; done
for r in 1 2; do for t in new base; do
  PP=$PYTHONPATH; if [ $t = base ]; then PP=$PWD/ab_base:$PYTHONPATH; fi
  PYTHONPATH=$PP timeout 100 python3 bench/fanin.py --mode gpu --probes 16 --seconds 15 --workers auto --no-check --out $R/gpu-$t-$r > $R/gpu-$t-$r.log 2>&1
  echo "gpu-$t $r $(grep '"probes"' $R/gpu-$t-$r.log | head -1)" >> $OUT/gil.txt
done; done
timeout 60 python3 bench/fanin.py --mode cpu --probes 8 --seconds 10 --workers auto --no-check --profile --profile-gil --out $R/prof > $R/prof.log 2>&1
python3 - $OUT/gil.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    tag, _, js = line.partition("{")
    try: d = json.loads("{" + js)
    except Exception: print(tag, "no result"); continue
    c = d.get("check", {})
    print(tag.strip(), d["decode_workers_started"], d["decode_worker_moves"], d["delivered_events_per_s"], d["cpu_s_per_m_records"], d["collector_cpu_s"], d["workers_cpu_s"], c.get("in_equals_disk_plus_drops"), d["drops"], d["shed_records"], d["threads_cpu_s"].get("cuptistream-probe-conn"))
PY
cd $R && tar czf $OUT/gil.tar.gz --exclude='*.zst' .
