"""The Kafka sink (``type: kafka``): one module per job.

- ``kafka``: the ``Sink`` (open, write, close, stats);
- ``kafka_config``: the YAML keys and the kafka-python settings they map to;
- ``kafka_route``: batch -> messages (topic and key templates, headers, size cuts);
- ``kafka_delivery``: the producer thread that tracks every message until acked;
- ``kafka_spool``: the on-disk FIFO used by ``on_unavailable: spool``.

``docs/kafka.md`` describes the guarantees.
"""

from .kafka import KafkaSink
from .kafka_config import KafkaSinkConfig

__all__ = ["KafkaSink", "KafkaSinkConfig"]
