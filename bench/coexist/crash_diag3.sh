#!/usr/bin/env bash
# probe.start: process + torch.profiler aborts at exit (double free): which activity kind does it? N runs each.
N=${N:-4}
R=$(pwd); W=/tmp/diag3; rm -rf $W; mkdir -p $W; cd $W
mk() { python - "$R/configs/default.yaml" "$1" "$2" <<'PY'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
drop = sys.argv[3].split(",") if sys.argv[3] else []
for s in c["sources"]:
    if s["type"] == "activity":
        s["kinds"] = [k for k in s["kinds"] if k not in drop]
c["probe"] = {"start": "process"}
yaml.safe_dump(c, open(sys.argv[2] + ".yaml", "w"))
PY
}
mk full ""; mk nomarker marker; mk noext external_correlation; mk kernelonly runtime,driver,marker,external_correlation,memcpy,memset
one() { v=$1; i=$2; mkdir -p $W/$v$i; cd $W/$v$i; timeout 150 python -m cuptistream.cli run -c $W/$v.yaml -o rec -- python $R/tests/gpu/workloads/profiler_coexist.py alone out.json > log 2>&1; echo $? > rc; }
export -f one; export W R
for i in $(seq 1 $N); do for v in full nomarker noext kernelonly; do echo "$v $i"; done; done | xargs -P 8 -n 2 bash -c 'one "$0" "$1"'
for v in full nomarker noext kernelonly; do echo "$v: rcs $(cat $W/$v[0-9]*/rc | sort | uniq -c | tr '\n' ' ')"; done
