#!/usr/bin/env bash
# One device call: what torch.profiler and cuptistream do to each other today (issue 25).
set -u
export PYTHONPATH=/tmp/site
T=/tmp/explore; mkdir -p $T
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
command -v nsys || ls /usr/local/cuda*/bin 2>/dev/null | grep -i nsys || echo "nsys: not found"
for s in hold yield after; do timeout 120 python bench/coexist/explore.py $s 2>&1 | tail -2; done
C135=/tmp/c135/nvidia/cu13/lib/libcupti.so.13
LD_PRELOAD=$C135 timeout 120 python bench/coexist/explore.py multi 2>&1 | tail -3
LD_PRELOAD=$C135 timeout 120 python bench/coexist/explore.py after 2>&1 | tail -3
echo "== alone"; timeout 120 python tests/gpu/workloads/profiler_coexist.py alone $T/alone.json 2>&1 | tail -2
echo "== under run"; timeout 120 /tmp/site/bin/cuptistream run -c configs/default.yaml -o $T/run1 -- python tests/gpu/workloads/profiler_coexist.py alone $T/run_alone.json 2>&1 | tail -5
echo "== session-first"; timeout 120 python tests/gpu/workloads/profiler_coexist.py session-first $T/sf.json 2>&1 | tail -3
echo "== profiler-first (py-spy dump after 40 s)"
python -X faulthandler tests/gpu/workloads/profiler_coexist.py profiler-first $T/pf.json > $T/pf.log 2>&1 &
pid=$!
for i in $(seq 1 40); do sleep 1; kill -0 $pid 2>/dev/null || break; done
if kill -0 $pid 2>/dev/null; then
  echo "HUNG after 40 s"; /tmp/site/bin/py-spy dump --native --pid $pid > $OUT/pf_pyspy.txt 2>&1; head -150 $OUT/pf_pyspy.txt
  kill -ABRT $pid; sleep 2; kill -9 $pid
fi
tail -40 $T/pf.log
cp $T/*.json $OUT/ 2>/dev/null
