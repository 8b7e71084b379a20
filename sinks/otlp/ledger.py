"""What the OTLP sink tells the pipeline it delivered: events acknowledged by the receiver, not items sent.

An event is delivered when the receiver answered 2xx to the request that carried it:

- a span event (kernel, memcpy, API call, ...) by its span, an ``Error`` by its log record, a PC
  sampling batch by its profile: one item per event, so items lost are events lost;
- any other event (``loss``, ``self_stats``, ...) is folded into the cumulative metrics, so by the
  metrics export made with its batch;
- an event that no configured signal carries, once its batch's requests were all acknowledged.

A span can wait for its parent (``reorder_window``) and leave with a later batch, so a write can lose
events of batches the pipeline already counted delivered. ``Ledger.settle`` splits a write's losses:
up to the batch's own event count are that batch's (``write`` raises them as ``DeliveryError.lost``),
the rest were delivered earlier and become ``Sink.delivery_losses()``. Items are interchangeable for
this count, so the totals are exact whichever events they were.
"""

from __future__ import annotations

from collections import Counter


class Ledger:
    def __init__(self) -> None:
        self.earlier: Counter[str] = Counter()  # cumulative: ``delivery_losses()``

    def settle(self, batch_events: int, lost: Counter[str]) -> dict[str, int]:
        """Split ``lost`` (reason -> events lost in one write): the part that is the batch's own
        (returned, at most ``batch_events``) and the rest, added to ``earlier``."""
        own: dict[str, int] = {}
        room = batch_events
        for reason, count in sorted(lost.items()):
            mine = min(room, count)
            if mine:
                own[reason] = mine
                room -= mine
            if count > mine:
                self.earlier[reason] += count - mine
        return own
