"""The config model: YAML → typed msgspec Structs, with errors that name the key path.

The top level has the sections ``session``, ``pipeline``, ``probe``, ``overhead``, ``statistics``,
``sources`` and ``sinks``. Each entry of ``sources`` and ``sinks`` names its component with
``type``; the component's own config Struct (a subclass of ``SourceConfig`` or ``SinkConfig``)
validates the rest of the entry.
``docs/config.md`` documents every key with its default.

This module is the model and how it is built (``build``, ``load``, ``convert``); reading the YAML
safely is ``config_yaml``, and turning msgspec's validation errors into one-line messages with the
key path is ``config_messages``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import msgspec

from cuptistream.config import registry
from cuptistream.config.loading import parse_yaml
from cuptistream.config.messages import short, shown_key, validation_message
from cuptistream.config.units import parse_duration, parse_percent, parse_size
from cuptistream.errors import ConfigError


class Size(int):
    """Bytes. YAML may say ``65536``, ``64KiB`` or ``10MB``."""


class Duration(float):
    """Seconds. YAML may say ``2``, ``0.5``, ``500ms`` or ``5min``."""


class Percent(float):
    """A fraction of a whole. YAML says ``1%`` or ``0.5%``."""


BUDGET_OFF = Percent(0.0)  # ``overhead.budget: off`` (YAML's false); compared by identity


FullPolicy = Literal["block", "drop_newest", "drop_oldest"]

DEFAULT_JOB_ENV = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "MASTER_ADDR", "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID", "SLURM_NODEID",
    "SLURM_LOCALID", "SLURM_STEP_ID", "KUBERNETES_POD_NAME", "HOSTNAME",
]  # fmt: skip


class Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base for every config Struct: unknown keys are errors."""


def require_at_least(key: str, value: float, least: float) -> None:
    """For ``__post_init__``: a ValueError (one line, the key path is added) unless ``value`` is a
    finite number >= ``least``."""
    if not (math.isfinite(value) and value >= least):
        raise ValueError(f"{key} must be at least {least:g}, got {value:g}")


def require_positive(key: str, value: float) -> None:
    """The same for a finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{key} must be more than 0, got {value:g}")


class BatchConfig(Strict):
    max_events: int = 8192
    max_bytes: Size = Size(4 * 1024 * 1024)
    max_latency: Duration = Duration(1.0)

    def __post_init__(self) -> None:
        require_at_least("max_events", self.max_events, 1)
        require_at_least("max_bytes", self.max_bytes, 1)
        require_positive("max_latency", self.max_latency)


class QueueConfig(Strict):
    max_bytes: Size = Size(64 * 1024 * 1024)
    full_policy: FullPolicy = "drop_oldest"

    def __post_init__(self) -> None:
        require_at_least("max_bytes", self.max_bytes, 1)


class SessionConfig(Strict):
    attributes: dict[str, str] = {}
    job_env: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_JOB_ENV))
    command_line: bool = False  # record each process's command line (it can carry secrets)


MAX_DECODE_WORKERS = 256
AUTO_DECODE_WORKERS_MAX = 8


class PipelineConfig(Strict):
    memory_budget: Size = Size(256 * 1024 * 1024)
    full_policy: FullPolicy = "drop_newest"
    batch: BatchConfig = msgspec.field(default_factory=BatchConfig)
    stats_interval: Duration = Duration(10.0)
    shutdown_deadline: Duration = Duration(10.0)
    # Processes that decode the probes' activity buffers, so that several probes decode on several
    # cores (``collector.workers``); 0 decodes on the probes' connection threads, in the collector
    # process; "auto": one per core but one, at most 8, started one per four probes (docs/config.md).
    decode_workers: int | Literal["auto"] = "auto"
    # The collector gives freed heap pages back (malloc_trim) while its anonymous memory is over
    # memory_budget, at most every 0.5 s (``collector.memory``).
    heap_trim: bool = True
    # Where the collector receives a decode worker's reply: "mapped" (a private mapping each, given
    # back when the sinks let go of its last event), "heap" (reused buffers; glibc keeps the pages of
    # freed replies, so the collector holds more memory), or "shared" (the worker packs the events
    # into shared-memory slots; the rest as "mapped": less CPU per record and less of the collector's
    # own memory than "mapped"; see docs/performance.md).
    worker_replies: Literal["heap", "mapped", "shared"] = "shared"

    def __post_init__(self) -> None:
        require_at_least("memory_budget", self.memory_budget, 1)
        if isinstance(self.decode_workers, int) and not 0 <= self.decode_workers <= MAX_DECODE_WORKERS:
            top = MAX_DECODE_WORKERS
            raise ValueError(f"decode_workers must be auto or between 0 and {top}, got {self.decode_workers}")
        if self.stats_interval < 0.01:  # 0 would emit accounting in a tight loop
            raise ValueError(f"stats_interval must be at least 10ms, got {self.stats_interval:g}s")
        require_positive("shutdown_deadline", self.shutdown_deadline)

    def decode_worker_count(self, *, in_program: bool = False) -> int:
        """``decode_workers`` with "auto" resolved for this machine (the CPUs this process may use).
        ``in_program``: the collector runs as threads of the observed program (``session(sinks=...)``),
        whose process tree is the user's: "auto" starts no worker there."""
        if isinstance(self.decode_workers, int):
            return self.decode_workers
        if in_program:
            return 0
        return max(0, min(AUTO_DECODE_WORKERS_MAX, len(os.sched_getaffinity(0)) - 1))


class ProbeConfig(Strict):
    """The observed process's side: where its collector is, and the shared memory for events."""

    collector: str = ""  # socket path of a running collector; "" starts one for the session
    # When a process under ``cuptistream run`` starts its probe: "cuda" when it first initializes
    # CUDA (torch, cuda.bindings, cupy), so processes that never use CUDA cost nothing; "process"
    # at start-up, for programs that reach CUDA some other way; "auto": "cuda" if a source traces
    # CUDA, else "process" (replay and synthetic sources).
    start: Literal["auto", "cuda", "process"] = "auto"
    memory_budget: Size = Size(32 * 1024 * 1024)  # encoded events queued in the probe (pipeline.full_policy)
    event_buffer_size: Size = Size(1024 * 1024)  # one shared-memory slot of encoded events
    event_buffers: int = 8  # slots: the events in flight to the collector are bounded by both
    # While another tool holds CUPTI (Nsight, a torch.profiler, another cuptistream), how often the
    # waiting sources try again (docs/coexistence.md).
    standby_retry: Duration = Duration(2.0)

    def __post_init__(self) -> None:
        require_at_least("standby_retry", self.standby_retry, 0.05)
        if self.event_buffer_size < 64 * 1024:
            raise ValueError("event_buffer_size must be at least 64KiB")
        if self.event_buffers < 2:
            raise ValueError("event_buffers must be at least 2")
        require_at_least("memory_budget", self.memory_budget, 1)


class OverheadConfig(Strict):
    """What the sampling sources (pc_sampling, sass) may cost the program, together: they adapt
    their duty cycles to stay under it (``cuptistream.overhead``). ``budget: off`` (YAML's
    false) keeps the duty cycles each source configures."""

    budget: Percent = Percent(0.01)

    def __post_init__(self) -> None:
        if self.budget is not BUDGET_OFF and not 0.0001 <= self.budget <= 0.5:
            raise ValueError(f"budget must be between 0.01% and 50%, or off; got {self.budget * 100:g}%")

    @property
    def fraction(self) -> float | None:
        return None if self.budget is BUDGET_OFF else float(self.budget)


class StatisticsConfig(Strict):
    """The collector's node-side statistics (``cuptistream.statistics``): per ``interval``, device
    and name, what the decoded kernel, copy and memset records add up to (``ActivityStats``,
    ``GpuStats`` events), and per launching stack where the probe samples stacks (``StackStats``)."""

    enabled: bool = True
    interval: Duration = Duration(10.0)  # aligned to multiples of it on the CUPTI clock
    max_names: int = 500  # kernel names per interval and device (top by time); the rest -> "other"
    # launching stacks per interval, device and process (``StackStats``, top by GPU time); the rest -> -3
    max_stacks: int = 200

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval) and 0.1 <= self.interval <= 3600):
            raise ValueError(f"interval must be between 100ms and 1h, got {self.interval:g}s")
        require_at_least("max_names", self.max_names, 1)
        require_at_least("max_stacks", self.max_stacks, 1)

    @property
    def interval_ns(self) -> int:
        return round(float(self.interval) * 1e9)


class StacksConfig(Strict):
    """Python call stacks of the threads that launch GPU work (``cuptistream.stacks``): the
    probe samples them every ``interval`` while an activity source traces in one of ``modes``, and
    each kernel, copy and memset is joined to the stack its launch was made from."""

    # Activity modes that take stacks; [] = off.
    modes: list[Literal["full", "budget"]] = msgspec.field(default_factory=lambda: ["full"])
    interval: Duration = Duration(0.001)
    max_depth: int = 48  # frames kept per stack (the innermost); the rest fold into "[truncated]"
    frames: Literal["user", "all"] = "user"  # user: the program's own code, no library frames
    max_table_bytes: Size = Size(8 * 1024 * 1024)  # frames and stacks interned per process

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval) and 0.0001 <= self.interval <= 1.0):
            raise ValueError(f"interval must be between 100us and 1s, got {self.interval:g}s")
        if not 1 <= self.max_depth <= 1024:
            raise ValueError(f"max_depth must be between 1 and 1024, got {self.max_depth}")
        if not 64 * 1024 <= self.max_table_bytes <= 1024**3:
            raise ValueError(
                f"max_table_bytes must be between 64KiB and 1GiB, got {int(self.max_table_bytes)} bytes"
            )


class ComponentConfig(Strict):
    type: str
    name: str = ""  # defaults to ``type``; must be unique among sources (or sinks)
    enabled: bool = True


class SourceConfig(ComponentConfig):
    """Base of every source's config."""


class RetryConfig(Strict):
    """How every sink re-sends what failed for a reason that may pass (the server busy or away, a full
    disk): exponential backoff with jitter, a server's ``Retry-After`` honoured, within ``max_elapsed``."""

    enabled: bool = True  # false: one attempt, then the data is counted as lost
    initial_backoff: Duration = Duration(0.5)
    max_backoff: Duration = Duration(10.0)
    multiplier: float = 2.0
    max_elapsed: Duration = Duration(30.0)  # from the first attempt until the data is given up

    def __post_init__(self) -> None:
        require_positive("initial_backoff", self.initial_backoff)
        require_at_least("max_backoff", self.max_backoff, self.initial_backoff)
        require_at_least("multiplier", self.multiplier, 1)
        require_positive("max_elapsed", self.max_elapsed)


DEFAULT_SINK_TIMEOUT = 10.0  # seconds: one request of a sink when ``timeout`` is not set


class SinkConfig(ComponentConfig):
    """Base of every sink's config: the queue, batching, retry and timeout settings every sink shares
    (like the OpenTelemetry Collector's exporter helper). ``docs/config.md`` documents them once."""

    queue: QueueConfig = msgspec.field(default_factory=QueueConfig)
    batch: BatchConfig | None = None  # None: the pipeline's batch settings
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    timeout: Duration | None = None  # one request or write; None: DEFAULT_SINK_TIMEOUT (otlp: OTEL_* first)
    # How long coming up (connect, TLS, login, metadata) may take before the sink is reported down
    # (it keeps retrying in the background); ``--require-healthy`` waits this long, then exits 4.
    connect_timeout: Duration = Duration(5.0)
    # Keys a sink used to have and what replaced them: a config that still says them gets a one-line
    # "renamed" error instead of "unknown key".
    renamed_keys: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        if self.timeout is not None:
            require_positive("timeout", self.timeout)
        require_positive("connect_timeout", self.connect_timeout)

    @property
    def request_timeout(self) -> float:
        """``timeout`` in seconds, the shared default when not set."""
        return DEFAULT_SINK_TIMEOUT if self.timeout is None else float(self.timeout)


class Config(msgspec.Struct, kw_only=True):
    session: SessionConfig = msgspec.field(default_factory=SessionConfig)
    pipeline: PipelineConfig = msgspec.field(default_factory=PipelineConfig)
    probe: ProbeConfig = msgspec.field(default_factory=ProbeConfig)
    overhead: OverheadConfig = msgspec.field(default_factory=OverheadConfig)
    statistics: StatisticsConfig = msgspec.field(default_factory=StatisticsConfig)
    stacks: StacksConfig = msgspec.field(default_factory=StacksConfig)
    sources: list[SourceConfig] = []
    sinks: list[SinkConfig] = []
    origin: str = "<dict>"
    raw: dict[str, Any] = {}  # the parsed YAML it was built from (handed to a collector process)
    # The class ``build`` found in the registry for each entry of ``sources`` and ``sinks``, in order:
    # the probe and the collector make their components from these, so validation and the runtime
    # use one resolution (a collector process rebuilds its Config from ``raw``, and resolves there).
    source_classes: list[type[Any]] = []
    sink_classes: list[type[Any]] = []

    def enabled_sources(self) -> list[tuple[SourceConfig, type[Any]]]:
        """Each enabled source's config with its class (a ``component.Source``)."""
        return [(c, cls) for c, cls in zip(self.sources, self.source_classes, strict=True) if c.enabled]

    def enabled_sinks(self) -> list[tuple[SinkConfig, type[Any]]]:
        """Each enabled sink's config with its class (a ``component.Sink``)."""
        return [(c, cls) for c, cls in zip(self.sinks, self.sink_classes, strict=True) if c.enabled]


class _RawConfig(Strict):
    session: SessionConfig = msgspec.field(default_factory=SessionConfig)
    pipeline: PipelineConfig = msgspec.field(default_factory=PipelineConfig)
    probe: ProbeConfig = msgspec.field(default_factory=ProbeConfig)
    overhead: OverheadConfig = msgspec.field(default_factory=OverheadConfig)
    statistics: StatisticsConfig = msgspec.field(default_factory=StatisticsConfig)
    stacks: StacksConfig = msgspec.field(default_factory=StacksConfig)
    sources: list[dict[str, Any]] = []
    sinks: list[dict[str, Any]] = []


def _dec_hook(kind: type, value: Any) -> Any:
    if kind is Size:
        return Size(parse_size(value))
    if kind is Duration:
        return Duration(parse_duration(value))
    if kind is Percent:
        return BUDGET_OFF if value is False or value == "off" else Percent(parse_percent(value))
    raise NotImplementedError(kind)


T = TypeVar("T")


def convert(data: Any, model: type[T], prefix: str = "") -> T:
    """Validate ``data`` against ``model``. Raises ConfigError naming the key path."""
    try:
        return msgspec.convert(data, model, dec_hook=_dec_hook)
    except msgspec.ValidationError as error:
        # One line, whatever the key: a key with a newline in it must not break the message.
        raise ConfigError(validation_message(error, data, prefix, model).replace("\n", "\\n")) from None


def _check_unique_names(entries: list[Any], section: str) -> None:
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        name = entry.name or entry.type
        if name in seen:
            raise ConfigError(
                f"{section}[{index}].name: {name!r} is already used by {section}[{seen[name]}]; "
                "give each a distinct name"
            )
        seen[name] = index
        entry.name = name


def build(data: Any, origin: str = "<dict>") -> Config:
    """Turn parsed YAML (a dict) into a Config, validating every component's entry with the config
    type of the class the registry finds for it."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"<top level>: expected a mapping of sections, got {short(data)}")
    _check_scalars(data, "")
    raw = convert(data, _RawConfig)
    sources: list[SourceConfig] = []
    source_classes: list[type[Any]] = []
    # A source that joins its records to the launching stacks says when it cannot (where the modes
    # were asked for: by default, sources that cannot simply take none).
    asked = "modes" in (data.get("stacks") or {})
    for index, entry in enumerate(raw.sources):
        path = f"sources[{index}]"
        cls = registry.source_class(_component_type(entry, path), path)
        source = convert(entry, cls.config_type, path)
        if asked and (problem := getattr(source, "stacks_problem", lambda modes: None)(raw.stacks.modes)):
            raise ConfigError(f"{path}: {problem}")
        sources.append(source)
        source_classes.append(cls)
    sinks: list[SinkConfig] = []
    sink_classes: list[type[Any]] = []
    for index, entry in enumerate(raw.sinks):
        path = f"sinks[{index}]"
        sink_cls = registry.sink_class(_component_type(entry, path), path)
        sink_classes.append(sink_cls)
        _check_renamed(entry, sink_cls.config_type.renamed_keys, path)
        sinks.append(convert(entry, sink_cls.config_type, path))
    _check_unique_names(sources, "sources")
    _check_unique_names(sinks, "sinks")
    if not any(s.enabled for s in sinks):
        raise ConfigError("sinks: no sink is enabled; add one, e.g. `sinks: [{type: file, directory: out}]`")
    return Config(
        session=raw.session, pipeline=raw.pipeline, probe=raw.probe, overhead=raw.overhead,
        statistics=raw.statistics, stacks=raw.stacks, sources=sources, sinks=sinks,
        source_classes=source_classes, sink_classes=sink_classes, origin=origin, raw=data,
    )  # fmt: skip


def _check_renamed(entry: dict[str, Any], renamed: dict[str, str], path: str) -> None:
    for key in entry:
        if key in renamed:
            raise ConfigError(
                f"{path}.{key}: renamed to {renamed[key]}; see docs/config.md, Keys every sink has"
            )


def _check_scalars(data: Any, path: str) -> None:
    """Refuse, with the key path, what no key can hold and what fails far from the config: a NUL
    character ("\\0" in YAML) in any key or value (file and socket calls), and an integer outside
    64 bits (the config is handed to the collector as msgpack, which cannot carry it)."""
    where = path or "<top level>"
    if isinstance(data, str):
        if "\0" in data:
            raise ConfigError(f"{where}: contains a NUL character; remove it")
    elif isinstance(data, int) and not isinstance(data, bool):
        if not -(2**63) <= data < 2**63:
            raise ConfigError(f"{where}: integer out of range (64 bits; sizes at most 8EiB)")
    elif isinstance(data, dict):
        for key, value in data.items():
            inner = f"{path}.{shown_key(key)}" if path else shown_key(key)
            _check_scalars(key, inner)
            _check_scalars(value, inner)
    elif isinstance(data, list):
        for index, value in enumerate(data):
            _check_scalars(value, f"{path}[{index}]")


def _component_type(entry: Any, path: str) -> str:
    if not isinstance(entry, dict):
        raise ConfigError(f"{path}: expected a mapping with a `type` key, got {short(entry)}")
    kind = entry.get("type")
    if "type" in entry and kind is None:  # YAML reads a bare `null` as nothing
        raise ConfigError(f'{path}.type: is empty; for the null sink write `type: "null"` (quoted)')
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"{path}.type: required key is missing (e.g. `type: file`)")
    return kind


def load(source: str | Path | dict[str, Any] | Config, *, given_as: str = "with -c") -> Config:
    """Load a Config from a YAML path, a dict, or pass a Config through. ``given_as`` says, in the
    file-not-found message, how the path was given (``with -c``, ``as the FILE argument``)."""
    if isinstance(source, Config):
        return source
    if isinstance(source, dict):
        return build(source)
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found; pass an existing YAML file {given_as}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start}); save the config as UTF-8") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read config: {error.strerror}") from None
    return build(parse_yaml(text, str(path)), origin=str(path))
