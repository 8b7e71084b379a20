"""Turns the recorder's tuples into events, on the source's worker thread."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from cuptistream.cupti.subscriber import Domain
from cuptistream.events import (
    ApiCall,
    Event,
    GraphNode,
    NvtxMarker,
    NvtxRange,
    ResourceChange,
    Synchronization,
)

from .recorder import Recorder
from .structs import _API, _GRAPH, _MARK, _RANGE, _RESOURCE, _SYNC, _graph_node_type


class EventBuilder:
    """Turns recorded tuples into events, off the application's threads."""

    def __init__(self, recorder: Recorder, api_names: dict[tuple[int, int], str]) -> None:
        self.recorder = recorder
        self.api_names = api_names
        self.pid = os.getpid()

    def build(self, records: Iterable[tuple[Any, ...]]) -> list[Event]:
        events: list[Event] = []
        domains = self.recorder.domain_names
        for r in records:
            tag = r[0]
            if tag == _RANGE:
                _, name, start, end, tid, depth, dom, category, color, payload, range_id = r
                events.append(
                    NvtxRange(
                        name=name, start=start, end=end, thread_id=tid, range_id=range_id, depth=depth,
                        domain=domains.get(dom, ""), category=category, color=color, payload=payload,
                    )
                )  # fmt: skip
            elif tag == _API:
                _, domain, cbid, start, end, tid, corr, status = r
                events.append(
                    ApiCall(
                        domain="runtime" if domain == Domain.RUNTIME_API else "driver",
                        name=self.api_names.get((domain, cbid), f"cbid_{cbid}"), cbid=cbid, start=start,
                        end=end, process_id=self.pid, thread_id=tid, correlation_id=corr, return_value=status,
                    )
                )  # fmt: skip
            elif tag == _MARK:
                _, name, ts, tid, dom, category, color, payload = r
                events.append(
                    NvtxMarker(
                        name=name, timestamp=ts, thread_id=tid, domain=domains.get(dom, ""),
                        category=category, color=color, payload=payload,
                    )
                )  # fmt: skip
            elif tag == _RESOURCE:
                _, op, ts, device_id, context_id, stream_id, module_id, crc, size = r
                events.append(
                    ResourceChange(
                        operation=op, timestamp=ts, device_id=device_id, context_id=context_id,
                        stream_id=stream_id, module_id=module_id, cubin_crc=crc, cubin_size=size,
                    )
                )  # fmt: skip
            elif tag == _GRAPH:
                _, op, ts, graph_id, node_id, node_type, original = r
                kind = "" if node_type < 0 else _graph_node_type(node_type)
                events.append(
                    GraphNode(
                        operation=op, timestamp=ts, graph_id=graph_id, node_id=node_id, node_type=kind,
                        original_node_id=original,
                    )
                )  # fmt: skip
            elif tag == _SYNC:
                _, sync_type, ts, context_id, stream_id = r
                events.append(
                    Synchronization(
                        sync_type=sync_type, start=ts, end=ts, context_id=context_id, stream_id=stream_id,
                        correlation_id=0,
                    )
                )  # fmt: skip
        return events
