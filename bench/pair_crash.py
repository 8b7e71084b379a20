"""PC sampling and SASS metrics together in one process: the crash diagnosis (issue 17).

Runs ``bench/sampling_overhead.py`` with both sources in one process and a SASS window often. Before
0f1ee91 a torch transformer crashed this way (segfault, heap corruption), 9 runs of 9 on the H100.
The knobs are the hypotheses tried, in docs/gpu-validation.md:

- ``--free off``: skip the SASS source's ``free`` of each record's function name (if CUPTI shared
  one with PC sampling). Still crashed: not the cause.
- ``--pc-method enable_disable``: PC sampling disabled between its windows. Still crashed.
- ``--headroom N``: flush buffers N times what GetDataProperties reported. Every crash followed a
  FlushData OUT_OF_MEMORY: kernels launched between the query and the flush add records. With 4x
  room, no crash; the source now always leaves room (``sass_api.flush_capacity``).

The condition ``pair_often`` (added here) runs PC sampling at its defaults and a SASS window every
``--sass-period`` seconds from 2 s on, ungoverned, so a short run sees several SASS flushes::

    python bench/pair_crash.py --free on -- --workload transformer --conditions pair_often --steady 60

Everything after ``--`` goes to sampling_overhead.py. Exit status 139 (SIGSEGV) is the crash.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from cuptistream.cupti import sass_api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--free", choices=["on", "off"], required=True)
    parser.add_argument("--sass-period", type=float, default=8.0)
    parser.add_argument("--pc-method", choices=["start_stop", "enable_disable"], default="start_stop",
                        help="enable_disable: PC sampling is disabled between its windows")  # fmt: skip
    parser.add_argument("--headroom", type=int, default=1,
                        help="SASS flush buffers this many times the records GetDataProperties reports")  # fmt: skip
    parser.add_argument("--sass-only", action="store_true", help="pair_often without PC sampling")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.free == "off":
        sass_api.free_function_names = lambda buffer: None
    if args.headroom > 1:
        plain, times = sass_api.FlushBuffer, args.headroom

        class Roomy(plain):  # type: ignore[valid-type,misc]
            def __init__(self, records: int, instances: int) -> None:
                super().__init__(records * times, instances)

        sass_api.FlushBuffer = Roomy  # type: ignore[misc]
    path = Path(__file__).with_name("sampling_overhead.py")
    spec = importlib.util.spec_from_file_location("sampling_overhead", path)
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sass = {**bench.SASS, "period": args.sass_period, "initial_delay": 2}
    pcs = {**bench.PC_SAMPLING, "duty_cycle": {"method": args.pc_method}}
    bench.CONDITIONS["pair_often"] = [sass] if args.sass_only else [pcs, sass]
    bench.BUDGETS["pair_often"] = False
    sys.argv = [str(path), *[a for a in args.bench_args if a != "--"]]
    print(
        f"pair_crash: both in one process, SASS name free {args.free}, PC {args.pc_method}, headroom {args.headroom}",
        flush=True,
    )
    bench.main()


if __name__ == "__main__":
    main()
