#!/usr/bin/env bash
# Which variant of "cuptistream run + torch.profiler" aborts at exit (double free), N runs each, 6 at a time.
N=${N:-6}
R=$(pwd); W=/tmp/diag; rm -rf $W; mkdir -p $W; cd $W
base=$R/configs/default.yaml
cp $base a.yaml; printf '\nprobe:\n  start: process\n' >> a.yaml
cp $base b.yaml; printf '\nprobe:\n  start: process\n  standby_retry: 600s\n' >> b.yaml
python - "$base" <<'PY'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
c["sources"] = [s for s in c["sources"] if s["type"] != "state"]
c["probe"] = {"start": "process"}
yaml.safe_dump(c, open("c.yaml", "w"))
PY
cp $base d.yaml
one() { v=$1; i=$2; mkdir -p $W/$v$i; cd $W/$v$i; PYTHONFAULTHANDLER=1 timeout 150 python -m cuptistream.cli run -c $W/$v.yaml -o rec -- python $R/tests/gpu/workloads/profiler_coexist.py alone out.json > log 2>&1; echo $? > rc; }
export -f one; export W R
for v in a b c d; do for i in $(seq 1 $N); do echo "$v $i"; done; done | xargs -P 6 -n 2 bash -c 'one "$0" "$1"'
for v in a b c d; do echo "$v: rcs $(cat $W/$v*/rc | sort | uniq -c | tr '\n' ' ')"; done
for v in a b c d; do f=$(grep -l "double free\|Fatal Python\|Aborted" $W/$v*/log | head -1); if [ -n "$f" ]; then echo "== first crash of $v: $f"; grep -v "_warn_once\|UserWarning" $f | tail -30; fi; done
