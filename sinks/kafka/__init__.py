"""The Kafka sink (``type: kafka``): one module per job.

- ``sink``: the ``Sink`` (open, write, close, stats);
- ``config``: the YAML keys and the kafka-python settings they map to;
- ``route``: batch -> messages (topic and key templates, headers, size cuts);
- ``delivery``: the producer thread that tracks every message until acked;
- ``spool``: the on-disk FIFO used by ``on_unavailable: spool``.

``docs/kafka.md`` describes the guarantees.
"""

from .config import KafkaSinkConfig
from .sink import KafkaSink

__all__ = ["KafkaSink", "KafkaSinkConfig"]
