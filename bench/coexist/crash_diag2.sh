#!/usr/bin/env bash
# Is the abort at exit under probe.start: process new with the coexistence code, or older? N runs each.
N=${N:-4}
R=$(pwd); W=/tmp/diag2; rm -rf $W; mkdir -p $W; cd $W
cp $R/configs/default.yaml a.yaml; printf '\nprobe:\n  start: process\n' >> a.yaml
one() { v=$1; i=$2; site=$3; order=$4; mkdir -p $W/$v$i; cd $W/$v$i; PYTHONPATH=$site timeout 150 python -m cuptistream.cli run -c $W/a.yaml -o rec -- python $R/tests/gpu/workloads/profiler_coexist.py $order out.json > log 2>&1; echo $? > rc; }
export -f one; export W R
mkdir -p /tmp/basesite; pip install -q --no-index --no-deps --target /tmp/basesite $(ls $R/.gpuwheels/*.whl | grep -v cuptistream-) $R/.gpuwheels/base/*.whl 2>/dev/null
for i in $(seq 1 $N); do echo "e $i /tmp/site no-profiler"; echo "f $i /tmp/basesite alone"; echo "g $i /tmp/basesite no-profiler"; done | xargs -P 6 -n 4 bash -c 'one "$0" "$1" "$2" "$3"'
for v in e f g; do echo "$v: rcs $(cat $W/$v*/rc | sort | uniq -c | tr '\n' ' ')"; done
command -v gdb && (cd $W && mkdir h && cd h && PYTHONPATH=/tmp/site timeout 200 python -m cuptistream.cli run -c $W/a.yaml -o rec -- gdb -q -batch -ex run -ex bt --args python $R/tests/gpu/workloads/profiler_coexist.py alone out.json 2>&1 | grep -v "New Thread\|Thread 0x\|exited\|_warn_once\|UserWarning" | tail -45) || echo "gdb: not found"
