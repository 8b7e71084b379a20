"""The pc_sampling source's configuration, and stall reasons chosen by name."""

from __future__ import annotations

import difflib
from typing import Annotated, Literal

import msgspec

from cuptistream.config import Duration, Size, SourceConfig, Strict
from cuptistream.errors import ConfigError


class DutyCycle(Strict):
    on: Duration = Duration(0.5)  # sampling window (under overhead.budget: the longest)
    off: Duration = Duration(19.0)  # pause between windows; 0 = sample all the time
    # How a window opens and closes: cuptiPCSamplingStart/Stop on an enabled context, or
    # cuptiPCSamplingEnable/Disable, which also removes what an enabled context costs between windows.
    method: Literal["start_stop", "enable_disable"] = "start_stop"


class PcSamplingConfig(SourceConfig):
    mode: Literal["continuous", "serialized"] = "continuous"
    stall_reasons: list[str] = []  # names (or unique parts of names); empty = every reason
    sampling_period: Annotated[int, msgspec.Meta(ge=5, le=31)] = 20  # 2**n cycles between samples per SM
    max_sampling_period: Annotated[int, msgspec.Meta(ge=5, le=31)] = 26  # adaptation stops here
    scratch_buffer_size: Size = Size(4 * 1024 * 1024)
    hardware_buffer_size: Size = Size(64 * 1024 * 1024)
    worker_sleep_span: Duration = Duration(0.1)  # CUPTI's worker thread wakes this often
    get_data_interval: Duration = Duration(1.0)  # drain this often while a window is open
    min_get_data_interval: Duration = Duration(0.1)
    collect_pcs: Annotated[int, msgspec.Meta(ge=1)] = 4096  # PCs per GetData
    duty_cycle: DutyCycle = msgspec.field(default_factory=DutyCycle)
    adapt: bool = True
    cubin_dir: str | None = None  # write each loaded cubin here once, as <crc>.cubin
    control: Literal["launch", "worker"] = "launch"  # which thread makes Start/Stop/GetData calls
    watchdog_timeout: Duration = Duration(30.0)


def select_stall_reasons(wanted: list[str], available: dict[int, str]) -> list[int]:
    """Indexes of the stall reasons named in ``wanted``: exact names, or a part of exactly one name
    (``long_scoreboard``). Raises ConfigError naming close matches."""
    if not wanted:
        return sorted(available)
    by_name = {name: index for index, name in available.items()}
    chosen: list[int] = []
    for want in wanted:
        if want in by_name:
            chosen.append(by_name[want])
            continue
        partial = [name for name in by_name if want in name]
        exact_suffix = [name for name in partial if name.endswith(want) and not name.endswith("_not_issued")]
        pick = partial if len(partial) == 1 else exact_suffix
        if len(pick) == 1:
            chosen.append(by_name[pick[0]])
            continue
        short = {name.rsplit("stalled_", 1)[-1]: name for name in by_name}  # long_scoreboard -> full name
        close = [short[c] for c in difflib.get_close_matches(want, list(short), n=5, cutoff=0.6)]
        close = (
            close or difflib.get_close_matches(want, list(by_name), n=5, cutoff=0.5) or sorted(partial)[:5]
        )
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"pc_sampling.stall_reasons: unknown stall reason {want!r} on this GPU{hint}")
    return sorted(set(chosen))
