"""Which SASS Metrics call sequence gives exact counts in every window? (GPU machine only)

``python tests/gpu/workloads/sass_sequences.py SEQUENCE`` runs 3 windows of 10 launches of the
NVRTC ``counted`` kernel (100-trip loop, 132 x 128 threads) and prints one JSON line: per window,
how many loop-body PCs read exactly warps x launches x 100, or the CUPTI error. Sequences:

- ``keep``: SetConfig once; per window Enable(lazy) → run → Flush → Disable.
- ``keep_gap``: ``keep`` plus one launch of the kernel between windows (outside any window).
- ``reset``: per window SetConfig → Enable(lazy) → run → Flush → Disable → UnsetConfig.
- ``reinit``: ``reset`` plus ProfilerDeInitialize / ProfilerInitialize between windows.
- ``eager``: like ``keep`` with lazy patching off (every function patched at Enable).
- ``eager_reset``: like ``reset`` with lazy patching off.
- ``flush``: SetConfig and Enable(lazy) once; per window run → Flush; Disable after the last.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from sampling_common import KERNELS, Cuda, compile_cubin

from cuptistream.cupti import sass_api as sass
from cuptistream.cupti.sampling_decode import LiveMemory, decode_sass_records


def main() -> None:
    sequence = sys.argv[1]
    lazy = not sequence.startswith("eager")
    reset = sequence in ("reset", "reinit", "eager_reset")
    stay = sequence == "flush"

    cuda = Cuda(0)
    mod = cuda.load(compile_cubin(KERNELS, cuda.arch()))
    counted = cuda.function(mod, "counted")
    out = cuda.alloc(132 * 128 * 4)
    sass.profiler_initialize()
    chip = sass.chip_name(0)
    metric_id = sass.metrics(chip)["smsp__sass_inst_executed"][0]
    expected = 132 * 128 // 32 * 10 * 100
    windows = []
    configured = False
    for window in range(3):
        row: dict[str, object] = {"window": window}
        try:
            if not configured:
                sass.set_config(0, [(metric_id, sass.GRANULARITY["gpu"])])
                configured = True
            if not (stay and window):
                sass.enable(cuda.ctx.value, lazy)
            t0 = time.perf_counter()
            for _ in range(10):
                cuda.launch(counted, 132, 128, out)
            cuda.sync()
            row["ms_per_launch"] = (time.perf_counter() - t0) * 100
            records, instances = sass.data_properties(cuda.ctx.value)
            row["records"] = records
            if records:
                buffer = sass.FlushBuffer(records, instances)
                sass.flush(cuda.ctx.value, buffer)
                decoded = decode_sass_records(
                    LiveMemory(), buffer.address, records, instances, {metric_id: "m"}, {}
                )
                values = [sum(r.values["m"]) for r in decoded if r.function_name == "counted"]
                row["loop_pcs_exact"] = sum(1 for v in values if v == expected)
                row["other_pcs_exact"] = sum(1 for v in values if v == expected // 100)
            if not stay or window == 2:
                row["dropped"] = sass.disable(cuda.ctx.value)
            if sequence == "keep_gap":
                cuda.launch(counted, 132, 128, out)
                cuda.sync()
            if reset:
                sass.unset_config(0)
                configured = False
                if sequence == "reinit":
                    sass.profiler_deinitialize()
                    sass.profiler_initialize()
        except Exception as error:
            row["error"] = str(error)
            row["where"] = traceback.format_exc().splitlines()[-3].strip()
        windows.append(row)
    print(json.dumps({"sequence": sequence, "expected_loop_pcs": 6, "windows": windows}))


if __name__ == "__main__":
    main()
