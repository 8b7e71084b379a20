"""The event schema: one msgspec Struct per event family, a tagged union, and the batch envelope.

These Structs are the single source of truth for what cuptistream emits. Every timestamp is in
nanoseconds on the CUPTI clock; add ``Batch.clock.offset_ns`` to get Unix-epoch nanoseconds.
``docs/events.md`` documents every field with its unit. Bump ``SCHEMA_VERSION`` on any
incompatible change (a field renamed, retyped or removed); adding a field with a default is compatible.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Union

import msgspec

SCHEMA_VERSION = 1


class Event(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True, gc=False):
    """Base of every event. The ``type`` tag names the family in the encoded form."""


# --- GPU work -------------------------------------------------------------------------------


class Kernel(Event, tag="kernel"):
    start: int
    end: int
    name: str
    device_id: int
    context_id: int
    stream_id: int
    correlation_id: int
    grid: tuple[int, int, int] = (0, 0, 0)
    block: tuple[int, int, int] = (0, 0, 0)
    registers_per_thread: int = 0
    static_shared_bytes: int = 0
    dynamic_shared_bytes: int = 0
    local_memory_per_thread: int = 0
    graph_id: int = 0
    graph_node_id: int = 0
    demangled_name: str | None = None


class Memcpy(Event, tag="memcpy"):
    start: int
    end: int
    bytes: int
    copy_kind: str  # "HtoD", "DtoH", "DtoD", "HtoH", "PtoP", ...
    src_kind: str  # memory kind: "pageable", "pinned", "device", "managed", ...
    dst_kind: str
    device_id: int
    context_id: int
    stream_id: int
    correlation_id: int
    src_device_id: int | None = None  # peer copies only
    dst_device_id: int | None = None
    graph_id: int = 0
    graph_node_id: int = 0


class Memset(Event, tag="memset"):
    start: int
    end: int
    bytes: int
    value: int
    memory_kind: str
    device_id: int
    context_id: int
    stream_id: int
    correlation_id: int
    graph_id: int = 0
    graph_node_id: int = 0


class GraphLaunch(Event, tag="graph_launch"):
    start: int
    end: int
    graph_id: int
    device_id: int
    context_id: int
    stream_id: int
    correlation_id: int


class GraphNode(Event, tag="graph_node"):
    """A graph or graph node was created, cloned or destroyed (resource callbacks)."""

    operation: str  # "graph_create", "node_create", "node_clone", "graph_destroy", ...
    timestamp: int
    graph_id: int
    node_id: int = 0
    node_type: str = ""
    original_node_id: int = 0  # for clones


# --- host API calls and annotations ---------------------------------------------------------


class ApiCall(Event, tag="api"):
    domain: str  # "runtime" or "driver"
    name: str
    cbid: int
    start: int
    end: int
    process_id: int
    thread_id: int
    correlation_id: int
    return_value: int = 0


class NvtxRange(Event, tag="nvtx_range"):
    name: str
    start: int
    end: int
    thread_id: int
    range_id: int = 0
    depth: int = 0  # push/pop nesting depth on the thread, 0 = outermost; start/end ranges have 0
    domain: str = ""
    category: int = 0
    color: int | None = None  # ARGB
    payload: int | float | None = None


class NvtxMarker(Event, tag="nvtx_marker"):
    name: str
    timestamp: int
    thread_id: int
    domain: str = ""
    category: int = 0
    color: int | None = None
    payload: int | float | None = None


class ExternalCorrelation(Event, tag="external_correlation"):
    external_kind: str  # "custom0", "custom1", "custom2", "openacc", ...
    external_id: int
    correlation_id: int


# --- synchronization, memory ----------------------------------------------------------------


class Synchronization(Event, tag="synchronization"):
    sync_type: str  # "event_synchronize", "stream_wait_event", "stream_synchronize", "context_synchronize"
    start: int
    end: int
    context_id: int
    stream_id: int
    correlation_id: int
    cuda_event_id: int = 0


class CudaEvent(Event, tag="cuda_event"):
    event_id: int
    context_id: int
    stream_id: int
    correlation_id: int
    device_timestamp: int = 0


class MemoryAllocation(Event, tag="memory"):
    operation: str  # "alloc" or "free"
    timestamp: int
    address: int
    bytes: int
    memory_kind: str
    device_id: int
    context_id: int
    stream_id: int
    correlation_id: int
    source: str = ""  # "runtime", "driver", "pool", ...


class MemoryPool(Event, tag="memory_pool"):
    operation: str  # "created", "destroyed", "trimmed"
    timestamp: int
    address: int
    pool_type: str
    size: int
    release_threshold: int
    device_id: int
    utilized_size: int = 0
    correlation_id: int = 0


class UnifiedMemory(Event, tag="unified_memory"):
    counter: str  # "bytes_transfer_htod", "cpu_page_fault_count", "gpu_page_fault", ...
    start: int
    end: int
    value: int
    address: int
    src_id: int
    dst_id: int
    process_id: int = 0


class Environment(Event, tag="environment"):
    """One device-environment sample. A field is None where that sample did not carry it."""

    device_id: int
    timestamp: int
    power_mw: int | None = None
    power_limit_mw: int | None = None
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    fan_speed_percent: int | None = None
    throttle_reasons: int | None = None


# --- process, device and CUPTI lifecycle ----------------------------------------------------


class ResourceChange(Event, tag="resource"):
    """Context, stream and module lifecycle (resource domain, or the activity context/stream kinds)."""

    operation: str  # "context_create", "context_destroy", "stream_create", "module_load", ...
    timestamp: int
    device_id: int = 0
    context_id: int = 0
    stream_id: int = 0
    module_id: int = 0
    cubin_crc: int = 0
    cubin_size: int = 0
    name: str = ""


class Device(Event, tag="device"):
    device_id: int
    name: str
    uuid: str
    compute_capability: tuple[int, int]
    sm_count: int = 0
    global_memory_bytes: int = 0
    core_clock_khz: int = 0


class Jit(Event, tag="jit"):
    operation: str  # "cache_load", "cache_store", "compile"
    start: int
    end: int
    device_id: int
    correlation_id: int
    cache_path: str = ""
    cache_size: int = 0


class Overhead(Event, tag="overhead"):
    """Time CUPTI or the driver spent on instrumentation (buffer flush, instrumentation, ...)."""

    overhead_kind: str
    object_kind: str
    object_id: int
    start: int
    end: int


class Error(Event, tag="error"):
    """A state-callback error or warning, a fatal error, or a failure of a cuptistream component."""

    severity: str  # "fatal", "error", "warning"; "info": a sink recovered (sink_health)
    origin: str  # "cupti_state", "source:<name>", "sink:<name>", "pipeline"
    message: str
    timestamp: int
    result_code: int = 0


class Activity(Event, tag="activity"):
    """Any other activity kind, field for field as CUPTI reported it."""

    kind: str
    fields: dict[str, int | float | str | None]


# --- sampling -------------------------------------------------------------------------------


class PcSample(msgspec.Struct, kw_only=True, omit_defaults=True):
    cubin_crc: int
    function_name: str
    function_index: int
    pc_offset: int
    stalls: dict[str, int]  # stall reason name -> samples


class PcSampleBatch(Event, tag="pc_samples"):
    timestamp: int
    device_id: int
    context_id: int
    range_id: int
    samples: list[PcSample]
    total_samples: int
    non_user_samples: int = 0
    dropped_samples: int = 0
    hardware_buffer_full: bool = False
    sampling_period: int = 0  # the exponent in use: a sample every 2^sampling_period cycles; 0 unknown


class SassRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    cubin_crc: int
    function_name: str
    function_index: int
    pc_offset: int
    values: dict[str, list[int]]  # metric name -> one value per instance


class SassMetricBatch(Event, tag="sass_metrics"):
    timestamp: int
    device_id: int
    context_id: int
    records: list[SassRecord]


def nan_as_none(values: Iterable[float]) -> list[float | None]:
    """Floats for an event's value lists, NaN as None: JSON has no NaN (msgspec writes null), and a
    warehouse reading null into a plain float column would store 0."""
    return [None if v != v else float(v) for v in values]


class PmSamples(Event, tag="pm_samples"):
    """Hardware counters of one device from PM sampling (``pm_sampling``), as columns: sample ``i``
    spans ``starts[i]`` to ``ends[i]`` (CUPTI clock ns) and metric ``metrics[m]`` read
    ``values[m][i]`` over it, in the metric's own unit (``%`` for ``*.pct_of_peak_*``, bytes per
    second for ``*.per_second``)."""

    device_id: int
    chip: str  # "GH100", ...; with ``backend: nvml``, the device's name as NVML gives it
    metrics: list[str]
    starts: list[int]
    ends: list[int]
    values: list[list[float | None]]  # one column per metric, one value per sample; None: not evaluated


class KernelMetrics(Event, tag="kernel_metrics"):
    """Per-kernel hardware metrics of an on-demand window (``cuptistream trace --metrics``): CUPTI's
    range profiler measured each kernel launched in the window on ``device_id`` on its own,
    replaying it ``passes`` times where the metrics need several passes. Per kernel name
    ``names[k]``, ``values[m][k]`` is metric ``metrics[m]``'s mean over its ``launches[k]`` profiled
    launches, in the metric's own unit."""

    start: int  # CUPTI clock ns: the window
    end: int
    device_id: int
    chip: str
    metrics: list[str]
    passes: int
    names: list[str]
    launches: list[int]
    values: list[list[float | None]]  # one column per metric, one value per name; None: not evaluated
    not_profiled: int = 0  # launches past the room of the window's counter data image


class GovernorDecision(Event, tag="governor"):
    """What the overhead governor decided for a sampling source, and the measurements behind it
    (``overhead.budget``; ``cuptistream.overhead``). Fractions are of the program's time."""

    timestamp: int
    source: str  # the governed source's name
    budget: float  # the session's budget; 0 when there is none (the configured duty cycle holds)
    share: float  # this source's part of it
    window_s: float  # the next windows' length
    pause_s: float  # the pause between windows
    duty: float  # window / (window + pause)
    unit_cost: float  # smoothed cost per second of open window, or per window (per_window), in seconds
    expected_cost: float  # the share of the program's time this plan should cost
    measured_open_s: float = 0.0  # the window just measured: how long it was open,
    measured_host_s: float = 0.0  # ... the host time it cost (measured),
    estimated_gpu_s: float = 0.0  # ... and the GPU time it cost (estimated from its length)
    windows: int = 0  # windows measured so far
    reason: str = ""
    per_window: bool = False  # a window costs the same whatever its length (SASS): unit_cost is per window


class CuptiYield(Event, tag="cupti_yield"):
    """A span in which cuptistream left CUPTI to another tool (``cuptistream.probe.coexist``).

    Nothing of ``missed`` was recorded between ``start`` and ``end``: the other tool had CUPTI. What
    the sources held at the yield was handed over first, so no record from before ``start`` is lost.
    """

    tool: str  # who took CUPTI: "torch.profiler", or the holder CUPTI named ("CUPTI for ...")
    start: int  # CUPTI clock, ns: the sources stepped aside
    end: int  # ... and came back (or the session stopped)
    missed: list[str]  # what was not recorded in the span: "activity:concurrent_kernel", "state", ...
    standby: list[str] = []  # sources still waiting at ``end`` (the tool kept CUPTI's subscriber)
    holder: str = ""  # who held the subscriber at ``end``, as CUPTI named it
    reason: str = ""  # "tool_started": the tool started while we ran; "held_at_start": it held CUPTI first


class TraceWindow(Event, tag="trace_window"):
    """A window in which an activity source traced (the probe's ``TraceSpan``), written by the
    collector when the window closed, after the events decoded from its buffers: a window that
    ``cuptistream trace`` asked for (``on_demand``), one the budget opened, or the copy and memset
    kinds left on after a budget window while CUPTI stays attached (until a stop or a pause)."""

    source: str  # the activity source's name
    window: int  # the probe's window number, per source stream
    start: int  # CUPTI clock, ns
    end: int
    kinds: list[str]  # activity kinds traced in it
    records: int  # activity records the collector decoded from the window's buffers
    on_demand: bool = False
    request: int = 0  # the collector's number for the ``cuptistream trace`` request (on demand)
    fresh: bool = False  # CUPTI was attached anew for it (``between_windows: detach``)


# --- call stacks of the launching threads (``stacks``; cuptistream.stacks) ------------------


class StackTable(Event, tag="stack_table"):
    """Frames and stacks one process interned since its last table: each is sent once, and ids are
    the process's own. Frame ``i`` is (``files[i]``, ``functions[i]``, ``lines[i]``) with id
    ``frame_ids[i]``; stack ``j`` has id ``stack_ids[j]`` and the frame ids ``stacks[j]``, outermost
    first. Frames named ``[...]`` (file ``<cuptistream>``) are cuptistream's own: ``[truncated]``
    (frames past ``max_depth``), ``[autograd backward]`` (inside ``backward()``: the kernels come
    from autograd's threads), ``[stack table full]``."""

    process_id: int
    frame_ids: list[int] = []
    files: list[str] = []
    functions: list[str] = []
    lines: list[int] = []
    stack_ids: list[int] = []
    stacks: list[list[int]] = []


class StackChanges(Event, tag="stack_changes"):
    """When each sampled thread of one process moved to another stack: thread ``thread_ids[i]``
    (``pthread_self``, as CUPTI's API records give it) was at stack ``stack_ids[i]`` from
    ``times[i]`` (CUPTI clock, ns) on, as seen by samples about ``interval_ns`` apart; it moved after
    ``previous[i]``, the sample before (0: none since sampling began). Stack id 0: the thread ran
    no Python (or ended)."""

    process_id: int
    interval_ns: int
    thread_ids: list[int] = []
    times: list[int] = []
    stack_ids: list[int] = []
    previous: list[int] = []


# --- statistics (computed by the collector from the records it decodes) ---------------------


class Histogram(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A base-2 exponential histogram of durations in ns, in OTLP's layout: with
    ``base = 2 ** (2 ** -scale)``, ``counts[k]`` holds the values in ``(base ** i, base ** (i + 1)]``
    for ``i = offset + k``; values of 0 are in ``zero_count``."""

    scale: int
    offset: int = 0
    counts: list[int] = []
    zero_count: int = 0
    min: int = 0
    max: int = 0


class ActivityStats(Event, tag="activity_stats"):
    """What the traced records of one category add up to, per interval, device and name
    (``statistics``; ``cuptistream.statistics``).

    Where only part of the interval was traced (``activity.mode: budget`` windows, or a span left
    to another tool), ``estimated`` is true and the ``estimated_*`` fields scale the measured ones
    to the whole interval: ``measured x interval / traced_ns``, where "interval" is the part of it
    the process was observed in (a program that starts or ends inside an interval, traced
    throughout, is measured). Otherwise they equal the measured ones.
    """

    interval_start: int  # CUPTI clock ns, a multiple of the interval
    interval_end: int
    device_id: int
    category: str  # "kernel", "memcpy" or "memset"
    name: str  # kernel name as recorded (``other`` past ``statistics.max_names``); copy kind; memory kind
    count: int
    total_ns: int
    durations: Histogram
    traced_ns: int  # how long within the interval this category was traced
    estimated: bool = False
    estimated_count: int = 0
    estimated_total_ns: int = 0
    bytes: int = 0  # memcpy and memset
    estimated_bytes: int = 0
    nccl: bool = False  # a NCCL kernel (its name starts with "nccl")


class StackStats(Event, tag="stack_stats"):
    """GPU time by the code that launched it, per interval, device and process (``statistics``
    with ``stacks`` on): row ``i`` is stack ``stack_ids[i]`` of that process's ``StackTable``, with
    the kernels, copies and memsets launched from it that ended in the interval. Ids below 1 are
    not the table's: -1 ``[no stack recorded]``, -2 ``[no Python stack]``, -3 ``other`` (the rows
    past ``statistics.max_stacks``, by GPU time). Estimates scale by ``traced_ns`` as
    ``ActivityStats``' do."""

    interval_start: int  # CUPTI clock ns, a multiple of the interval
    interval_end: int
    device_id: int
    process_id: int
    traced_ns: int  # how long within the interval kernels were traced
    stack_ids: list[int] = []
    gpu_ns: list[int] = []  # summed durations of the GPU work launched from the stack
    launches: list[int] = []  # GPU records (a graph replay counts each of its kernels)
    estimated: bool = False
    estimated_gpu_ns: list[int] = []
    estimated_launches: list[int] = []


class GpuStats(Event, tag="gpu_stats"):
    """One device's interval: how busy it was while traced (``statistics``). Fractions are of the
    traced time; with ``traced_fraction`` < 1 they are estimates for the whole interval."""

    interval_start: int  # CUPTI clock ns
    interval_end: int
    device_id: int
    traced_ns: int  # how long within the interval kernels were traced
    traced_fraction: float
    busy_ns: int  # union of kernel, copy and memset time within the traced time
    busy_fraction: float
    kernel_ns: int  # sum of kernel durations (overlapping kernels count each)
    nccl_ns: int  # ... of NCCL kernels
    copy_ns: int
    memset_ns: int
    kernels: int
    copies: int
    memsets: int
    copy_bytes: int = 0
    estimated: bool = False


class PmStats(Event, tag="pm_stats"):
    """One device's hardware counters over an interval (``statistics``, from ``PmSamples``): per
    metric ``metrics[m]``, the mean and the 5th, 50th and 95th percentiles of the samples that
    ended in the interval."""

    interval_start: int  # CUPTI clock ns, a multiple of the interval
    interval_end: int
    device_id: int
    samples: int
    metrics: list[str]
    # None where no sample of the interval had a value for the metric (CUPTI could not evaluate it)
    mean: list[float | None]
    p5: list[float | None]
    p50: list[float | None]
    p95: list[float | None]


class PmKernelStats(Event, tag="pm_kernel_stats"):
    """One kernel name's hardware counters over an interval (``statistics``, from ``PmSamples`` and
    the kernels of one process on ``device_id``; ``statistics.pm_attribution``). Per metric
    ``metrics[m]``, ``mean[m]`` is the mean of the samples the name's kernels ran in, each weighted
    by the kernels' overlap with it: the device's counters, shared by whatever ran in the sample
    (``own_share`` and ``all_share`` say how much that was). Names as ``ActivityStats``' (the top
    ones by kernel time, the rest as ``other``); no row for a name no sample covered."""

    interval_start: int  # CUPTI clock ns, a multiple of the interval
    interval_end: int
    device_id: int
    name: str
    kernel_ns: int  # the name's kernel time ended in the interval (its ActivityStats.total_ns)
    covered_ns: int  # of it, overlapping samples
    covered_share: float  # covered_ns / kernel_ns
    samples: int  # samples the name's kernels overlapped
    metrics: list[str]
    mean: list[float | None]  # per metric, weighted by overlap; None: no covered sample had a value
    own_share: float  # of those samples' traced time, how much the name's kernels filled
    all_share: float  # ... and all of the process's kernels (above 1: kernels ran at once)
    traced_ns: int  # ns of the interval traced for kernels (as ActivityStats.traced_ns)


# --- accounting -----------------------------------------------------------------------------


class Loss(Event, tag="loss"):
    """Events or records that were lost, and where. Every drop anywhere is reported as one of these."""

    stage: str  # "cupti", "probe", "intake", "sink:<name>", "pc_sampling", "sass", ...
    reason: str  # "cupti_buffer_dropped", "queue_full", "delivery_failed", "deadline", ...
    count: int  # events (or records/samples: see ``unit``) lost in [since, until]
    since: int  # Unix-epoch ns
    until: int  # Unix-epoch ns
    unit: str = "events"


class StageStats(msgspec.Struct, kw_only=True):
    events_in: int = 0
    events_out: int = 0  # handed on (a sink: accepted by ``write``) and not lost since
    events_dropped: int = 0
    # A sink's part of ``events_out``: acknowledged by its receiver (a file written, an HTTP 200, a
    # Kafka ack), and waiting in its spool instead. ``delivered`` never counts a spooled event.
    events_delivered: int = 0
    events_spooled: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    queued_bytes: int = 0
    counters: dict[str, int] = {}  # a sink's own (Sink.stats()): acked, retried, spooled, ...


class SelfStats(Event, tag="self_stats"):
    """Cumulative counters since the session started, per stage (``intake``, ``sink:<name>``)."""

    timestamp: int  # Unix-epoch ns
    stages: dict[str, StageStats]


AnyEvent = Union[  # noqa: UP007 - msgspec needs a real Union for the tagged decode
    Kernel,
    Memcpy,
    Memset,
    GraphLaunch,
    GraphNode,
    ApiCall,
    NvtxRange,
    NvtxMarker,
    ExternalCorrelation,
    Synchronization,
    CudaEvent,
    MemoryAllocation,
    MemoryPool,
    UnifiedMemory,
    Environment,
    ResourceChange,
    Device,
    Jit,
    Overhead,
    Error,
    Activity,
    PcSampleBatch,
    SassMetricBatch,
    PmSamples,
    KernelMetrics,
    GovernorDecision,
    CuptiYield,
    TraceWindow,
    StackTable,
    StackChanges,
    ActivityStats,
    StackStats,
    GpuStats,
    PmStats,
    PmKernelStats,
    Loss,
    SelfStats,
]

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__struct_config__.tag: cls
    for cls in AnyEvent.__args__  # type: ignore[attr-defined]
}


# --- the stored form of the hot kinds --------------------------------------------------------


class Columns(msgspec.Struct, tag_field="type", tag="columns", kw_only=True, gc=False):
    """Up to 8192 events of one type (kernel, memcpy, memset, api) as one element, field by field.

    Not an event: a sink that stores batches as they are (``Sink.accepts_columns``: the file sink's
    msgpack) gets the hot kinds' records this way, and every reader expands it back into the events
    it stands for (``codec.expand_columns``), so no consumer ever sees one. Per record it costs the
    collector about half the CPU of one map per event, packing and zstd together.

    The events are ``rows`` ``event``-typed maps: every field in ``ints``, then each field in
    ``triples`` (three integers), then each field in ``strings``. The rows come group by group:
    ``counts[g]`` rows have the string values ``groups[g]`` (in ``strings`` order). ``values``
    holds the integers slot by slot (``ints``, then each triple's three parts), each slot ``rows``
    little-endian int64, each the difference from the row before it (the first from 0), wrapping
    modulo 2**64.
    """

    event: str
    rows: int
    ints: list[str]
    triples: list[str]
    strings: list[str]
    groups: list[list[str]]
    counts: list[int]
    values: bytes  # last: the packer writes it in place after the encoded rest

    def check(self) -> None:
        """Raise ``msgspec.ValidationError`` where the sizes do not add up (a damaged element): every
        reader checks before it expands one."""
        slots = len(self.ints) + 3 * len(self.triples)
        if (
            self.rows <= 0
            or len(self.values) != slots * self.rows * 8
            or len(self.counts) != len(self.groups)
            or sum(self.counts) != self.rows
            or min(self.counts) < 0
            or any(len(texts) != len(self.strings) for texts in self.groups)
        ):
            raise msgspec.ValidationError(f"columns of {self.event}: sizes do not match {self.rows} rows")


# --- the batch envelope ---------------------------------------------------------------------


class DeviceInfo(msgspec.Struct, kw_only=True):
    device_id: int  # the CUDA ordinal in that process (after CUDA_VISIBLE_DEVICES)
    name: str
    uuid: str


class Resource(msgspec.Struct, kw_only=True):
    """Who produced a batch: one observed process (or the collector, for its own accounting)."""

    host: str
    pid: int
    process_name: str
    command_line: list[str]
    devices: list[DeviceInfo] = []  # the GPUs this process's records name so far
    job: dict[str, str] = {}  # RANK, LOCAL_RANK, WORLD_SIZE, SLURM_JOB_ID, ... from the environment
    ppid: int = 0
    # From torchrun's, SLURM's or Open MPI's variables; None outside a distributed job.
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None


class ClockSync(msgspec.Struct, kw_only=True):
    """One reading of the CUPTI clock and the Unix clock taken back to back."""

    cupti_ns: int
    unix_ns: int

    @property
    def offset_ns(self) -> int:
        """Add to a CUPTI timestamp to get Unix-epoch ns."""
        return self.unix_ns - self.cupti_ns


class BatchHeader(msgspec.Struct, kw_only=True):
    """The fields every batch carries ahead of its events, in wire order. ``Batch``, ``EncodedBatch``
    and the JSON Lines ``Envelope`` derive from it; copy a header with ``header_fields``."""

    schema_version: int
    session_id: str
    seq: int  # 0, 1, 2, ... per session; a gap means batches were lost
    resource: Resource
    attributes: dict[str, str]
    clock: ClockSync


HEADER_FIELDS: tuple[str, ...] = BatchHeader.__struct_fields__


def header_fields(header: BatchHeader) -> dict[str, Any]:
    """``header``'s ``BatchHeader`` fields by name, to build another kind of batch under it."""
    return {name: getattr(header, name) for name in HEADER_FIELDS}


class Batch(BatchHeader, kw_only=True):
    events: list[AnyEvent]


class EncodedBatch(BatchHeader, kw_only=True):
    """A Batch whose events are already msgpack-encoded. Encodes to the same bytes as the Batch."""

    events: msgspec.Raw
