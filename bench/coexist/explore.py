"""Which CUPTI subscriber states let torch.profiler (Kineto) record kernels: one scenario per process.

``python bench/coexist/explore.py SCENARIO`` prints one JSON line. Scenarios:
hold (we hold the callback subscriber while the profiler runs), yield (we release it first, then try
to take it back after the profiler), after (the profiler alone, then we try to subscribe),
multi (cuptiSubscribe_v2 with allowMultipleSubscribers=1, for libcupti >= 13.3).
"""

from __future__ import annotations

import json
import os
import sys


def kernels(torch, steps=3):
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(256, 256, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            a = a @ a
            a = a / a.norm()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if str(e.device_type).endswith("CUDA"))


def try_subscribe(sub):
    from cuptistream.cupti.subscriber import Domain, SubscriberBusy

    try:
        return "ok", sub.register(Domain.STATE, lambda *a: None)
    except SubscriberBusy as error:
        return f"busy holder={error.holder!r}", None
    except Exception as error:
        return f"{type(error).__name__}: {error}", None


def main(scenario: str) -> None:
    import torch

    torch.zeros(1, device="cuda")
    from cuptistream.cupti import driver, subscriber

    out: dict = {
        "scenario": scenario,
        "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI"),
        "cupti_version": driver.cupti_version(),
    }
    sub = subscriber.Subscriber()
    if scenario == "multi":
        subscriber._PARAMS_SIZES = (40,)
        orig = subscriber._SubscriberParams

        class Multi(orig):  # type: ignore[misc, valid-type]
            def __init__(self, **kw):
                super().__init__(**kw)
                self.allowMultipleSubscribers = 1

        subscriber._SubscriberParams = Multi
    if scenario in ("hold", "yield", "multi"):
        out["ours_first"], reg = try_subscribe(sub)
        if scenario == "yield" and reg is not None:
            reg.remove()
        out["kineto_kernels"] = kernels(torch)
        if scenario == "yield":
            out["ours_after"], reg2 = try_subscribe(sub)
            out["kineto_kernels_again"] = kernels(torch)
            if reg2 is not None:
                reg2.remove()
                out["kineto_kernels_after_ours_released"] = kernels(torch)
    elif scenario == "after":
        out["kineto_kernels"] = kernels(torch)
        out["ours_after"], reg = try_subscribe(sub)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
