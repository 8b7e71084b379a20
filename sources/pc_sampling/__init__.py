"""PC sampling source (type ``pc_sampling``): continuous, duty-cycled, per CUDA context.

Collects with CUPTI's PC Sampling API (``cupti_pcsampling.h``, guide §2.10) and emits
``PcSampleBatch`` events: per PC, the cubin CRC, function, pc offset and named stall-reason counts.

How it runs:
- Each CUDA context (found at start, or created later: resource callback) is enabled once. With a
  duty cycle (``duty_cycle.off > 0``) start/stop control is on: an ``on`` window opens with
  ``cuptiPCSamplingStart``, closes after ``duty_cycle.on`` with ``cuptiPCSamplingStop`` and a drain
  (``cuptiPCSamplingGetData``), and the next opens ``duty_cycle.off`` later. ``duty_cycle.off: 0``
  samples from Enable on, all the time, draining every ``get_data_interval``.
- A worker thread keeps the schedule. With ``control: launch`` (the default) the calls themselves
  run on the application's thread at the exit of its next kernel launch once one is due
  (``cuptistream.cupti.launch_hook``): from our own thread, ``cuptiPCSamplingStart`` hung the launch
  path under PyTorch. ``control: worker`` makes them from the worker thread, which suits programs
  that launch from one thread and go idle.
- Drains also happen on every module unload (continuous mode needs it, guide §2.10.4), when a
  context is destroyed, and at stop (``cuptiPCSamplingDisable`` writes the rest to the buffer we gave).
- A drain only makes the C calls: GetData fills one of a few pooled buffers, which the worker
  decodes and emits. Decoding thousands of PCs inside a launch held the application's thread for up
  to 1 s per 20 s under torch; when every buffer still waits, the drain decodes one itself (bounded
  memory before speed).
- Losses are reported, never silent: hardware-dropped samples, a full hardware buffer
  (``CUPTI_ERROR_OUT_OF_MEMORY``), PCs left uncollected. On a loss the source adapts: first a shorter
  drain interval, then a longer sampling period (each step announced by a warning Error event).
- CUPTI samples one context per GPU (guide §2.10.7): a second context on the same GPU gets a
  warning event and is not sampled.
- A CUPTI call that does not return within ``watchdog_timeout`` disables the source with an Error
  event (``cuptistream.cupti.watchdog``).

The defaults (window, pause, sampling period, buffer sizes) are sized from measurements of torch
programs; what they cost is docs/performance.md's row "PC sampling and SASS together".

Modules: ``source`` (start, stop, resource callbacks), ``attach`` (Enable, configure, Disable per
context), ``schedule`` (the worker and each context's tick), ``windows`` (window lengths and pauses,
governed under a budget), ``drain`` (GetData into pooled buffers, decoding, events), ``adapt`` (what a
loss changes), ``context`` (the per-context state) and ``config``.
"""

from .config import PcSamplingConfig, select_stall_reasons
from .source import PcSamplingSource

__all__ = ["PcSamplingConfig", "PcSamplingSource", "select_stall_reasons"]
