"""The Kafka sink's config: the YAML keys, their cross-checks, and the kafka-python settings they map to.

Secrets never live in the config: ``sasl_password_env`` and ``ssl_key_password_env`` name environment
variables that hold them, read once at ``open()`` and never logged.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

from cuptistream.config import Duration, SinkConfig, Size
from cuptistream.errors import SinkUnavailableError
from cuptistream.plugin import secret_from_env, sink_where

Compression = Literal["zstd", "gzip", "lz4", "snappy", "none"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSinkConfig(SinkConfig):
    """Keys of a ``type: kafka`` sink entry. ``docs/kafka.md`` explains each one."""

    bootstrap_servers: str | list[str] = "localhost:9092"
    client_id: str = "cuptistream"
    # Templates. Per batch: {host} {pid} {session_id} {process_name}; per event: {event_family} {device}.
    topic: str = "cuptistream.events"
    key: str = "{host}:{pid}:{device}"
    value_format: Literal["msgpack", "json", "jsonl"] = "msgpack"  # jsonl: a row per event (rows.py)
    headers: dict[str, str] = {}  # extra static headers on every message

    # Producer settings.
    acks: Literal["all", 0, 1] = "all"
    enable_idempotence: bool = True
    compression: Compression = "zstd"
    linger: Duration = Duration(0.005)
    batch_size: Size = Size(1024 * 1024)
    max_message_bytes: Size = Size(1024 * 1024)  # larger batches are split into several messages
    # The shared ``timeout`` is kafka-python's request_timeout_ms; the shared ``retry.max_elapsed`` its
    # delivery_timeout_ms and, in block mode, how long a message may stay unacked before it is lost.

    # Delivery tracking.
    max_in_flight_bytes: Size = Size(32 * 1024 * 1024)
    on_unavailable: Literal["block", "spool"] = "block"
    spool_after: Duration = Duration(1.0)  # spool mode: how long a write waits for room before spooling
    spool_directory: str = ""
    spool_max_bytes: Size = Size(1024**3)
    spool_segment_bytes: Size = Size(4 * 1024 * 1024)
    spool_fsync: Literal["never", "batch", "rotate"] = "rotate"

    # Security.
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str = ""
    sasl_password_env: str = ""
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_key_password_env: str = ""
    ssl_check_hostname: bool = True

    renamed_keys = {
        "request_timeout": "timeout",
        "delivery_timeout": "retry.max_elapsed",
        "retry_backoff": "retry.initial_backoff",
        "retry_backoff_max": "retry.max_backoff",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        # msgspec turns these ValueErrors into a ConfigError naming the sink entry.
        if self.enable_idempotence and self.acks != "all":
            raise ValueError("enable_idempotence needs acks: all (or set enable_idempotence: false)")
        if self.on_unavailable == "spool" and not self.spool_directory:
            raise ValueError("on_unavailable: spool needs spool_directory (one directory per process)")
        if self.max_message_bytes < 1024:
            raise ValueError("max_message_bytes must be at least 1KiB")
        if self.sasl_mechanism and not self.security_protocol.startswith("SASL_"):
            raise ValueError("sasl_mechanism needs security_protocol: SASL_PLAINTEXT or SASL_SSL")
        if self.security_protocol.startswith("SASL_") and not self.sasl_mechanism:
            raise ValueError(f"security_protocol: {self.security_protocol} needs sasl_mechanism")

    @property
    def servers(self) -> list[str]:
        raw = [self.bootstrap_servers] if isinstance(self.bootstrap_servers, str) else self.bootstrap_servers
        return [s.strip() for item in raw for s in item.split(",") if s.strip()]


def producer_settings(config: KafkaSinkConfig) -> dict[str, Any]:
    """kafka-python ``KafkaProducer`` keyword arguments for ``config`` (secrets resolved from env)."""
    # The codec's module, as kafka.codec looks for it; found without importing kafka-python (slow
    # to import: it is imported in the background, when the sink connects).
    module = {"zstd": "zstandard", "gzip": "gzip", "lz4": "lz4.frame", "snappy": "snappy"}
    if config.compression != "none" and not _importable(module[config.compression]):
        package = {"zstd": "zstandard", "gzip": "gzip", "lz4": "lz4", "snappy": "python-snappy"}
        raise SinkUnavailableError(
            f"{sink_where(config.name, 'compression')}: {config.compression} needs the "
            f"{package[config.compression]} package; install it or choose another compression"
        )
    settings: dict[str, Any] = {
        "bootstrap_servers": config.servers,
        "client_id": config.client_id,
        "acks": -1 if config.acks == "all" else config.acks,
        "enable_idempotence": config.enable_idempotence,
        "compression_type": None if config.compression == "none" else config.compression,
        "linger_ms": int(config.linger * 1000),
        "batch_size": int(config.batch_size),
        # Our own splitting keeps messages under max_message_bytes; leave room for the envelope.
        "max_request_size": int(config.max_message_bytes) + 64 * 1024,
        "request_timeout_ms": int(config.request_timeout * 1000),
        # kafka-python's own retries stop at the shared deadline; it insists on
        # delivery_timeout_ms >= linger_ms + request_timeout_ms.
        "delivery_timeout_ms": max(
            int(config.retry.max_elapsed * 1000),
            int(config.request_timeout * 1000) + int(config.linger * 1000),
        ),
        "max_block_ms": int(config.connect_timeout * 1000),
        "bootstrap_timeout_ms": int(config.connect_timeout * 1000),
        "security_protocol": config.security_protocol,
    }
    if config.sasl_mechanism:
        settings["sasl_mechanism"] = config.sasl_mechanism
        settings["sasl_plain_username"] = config.sasl_username
        if config.sasl_password_env:
            env = config.sasl_password_env
            settings["sasl_plain_password"] = secret_from_env(config.name, "sasl_password_env", env)
    if config.security_protocol in ("SSL", "SASL_SSL"):
        settings["ssl_check_hostname"] = config.ssl_check_hostname
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if getattr(config, key):
                settings[key] = getattr(config, key)
        if config.ssl_key_password_env:
            env = config.ssl_key_password_env
            settings["ssl_password"] = secret_from_env(config.name, "ssl_key_password_env", env)
    return settings


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing
        return False
