"""A small torch MLP training loop, run either under a cuptistream activity source or under
torch.profiler, to compare per-kernel-name counts. One CUPTI subscriber per process, so each
mode runs in its own process: ``python -m tests.gpu.workloads.torch_mlp {cuptistream|kineto} STEPS OUT``.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path


def make():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    return torch, model, opt, x, y


def steps(torch, model, opt, x, y, count: int) -> None:
    for _ in range(count):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()


def main(mode: str, count: int, out: str) -> None:
    torch, model, opt, x, y = make()
    steps(torch, model, opt, x, y, 3)  # warm-up (cuBLAS handles, allocator) outside both traces
    names: collections.Counter[str] = collections.Counter()
    if mode == "kineto":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            steps(torch, model, opt, x, y, count)
        path = out + ".trace.json"
        prof.export_chrome_trace(path)
        trace = json.loads(Path(path).read_text())
        for event in trace["traceEvents"]:
            if event.get("cat") == "kernel":
                names[event["name"]] += 1
    else:
        from cuptistream.events import Kernel
        from sources.activity import ActivitySource, ActivitySourceConfig
        from tests.gpu.workloads.collect import Collect

        sink = Collect()
        source = ActivitySource(
            ActivitySourceConfig(type="activity", kinds=["concurrent_kernel"], demangle=True), sink
        )
        source.start()
        steps(torch, model, opt, x, y, count)
        source.stop()
        for event in sink.events:
            if isinstance(event, Kernel):
                names[event.demangled_name or event.name] += 1
    Path(out).write_text(json.dumps(dict(names), indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
