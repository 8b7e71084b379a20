#!/usr/bin/env bash
# Native stacks of the abort at exit under probe.start: process with torch.profiler (docs/coexistence.md).
R=$(pwd); W=/tmp/btdiag; rm -rf $W; mkdir -p $W; cd $W
gcc -shared -fPIC -O0 -o bt.so $R/bench/coexist/abort_backtrace.c || exit 1
cp $R/configs/default.yaml a.yaml; printf '\nprobe:\n  start: process\n' >> a.yaml
one() { i=$1; mkdir -p $W/r$i; cd $W/r$i; timeout 150 python -m cuptistream.cli run -c $W/a.yaml -o rec -- env LD_PRELOAD=$W/bt.so python $R/tests/gpu/workloads/profiler_coexist.py alone out.json > log 2>&1; echo $? > rc; }
export -f one; export W R
seq 1 8 | xargs -P 8 -n 1 bash -c 'one "$0"'
echo "rcs: $(cat $W/r*/rc | sort | uniq -c | tr '\n' ' ')"
n=0; for f in $W/r*/log; do if grep -q "native stack" $f; then n=$((n+1)); [ $n -le 2 ] && { echo "== $f"; sed -n '/native stack/,$p' $f | head -40; }; fi; done
