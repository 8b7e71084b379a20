"""The probe↔collector channel: shared-memory slot pools and the small messages that announce them.

Bulk data (CUPTI activity buffers, encoded event chunks) lives in ``SlotPool`` shared memory (an
anonymous memfd handed to the collector over the Unix socket); the socket carries only small
msgpack messages (``messages``). A slot's header says what it holds, so the collector can drain
every published slot even after the probe's process has died.
"""
