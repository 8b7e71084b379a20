"""Recordings: how events are encoded (``codec``, with ``column_structs`` for the stored columns
and ``producers`` for the process each chunk and batch envelope names), how batches are framed
(``framing``), written as segments (``segments``), read back tolerantly (``reader``,
``kafka_reader``), repaired (``repair``), and shown as JSON Lines or flat rows (``jsonl``, ``rows``).
"""
