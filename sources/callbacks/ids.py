"""The CUPTI look-ups the callbacks need (ids, the clock, a cubin's CRC), one object so tests can
supply them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuptistream.cupti import cubin_api, library


class CuptiIds:
    """Ids and the clock, from cupti-python. Every method is a cheap CUPTI call, safe in callbacks."""

    def __init__(self, cupti: Any) -> None:
        self.now: Callable[[], int] = cupti.get_timestamp
        self._cupti = cupti

    def context(self, context: int) -> tuple[int, int]:
        """(device id, context id) of a CUcontext."""
        return self._cupti.get_device_id(context), self._cupti.get_context_id(context)

    def stream(self, context: int, stream: int) -> int:
        return int(self._cupti.get_stream_id_ex(context, stream, 0))

    def graph(self, graph: int) -> int:
        return int(self._cupti.get_graph_id(graph)) if graph else 0

    def node(self, node: int) -> int:
        return int(self._cupti.get_graph_node_id(node)) if node else 0

    def cubin_crc(self, cubin: int, size: int) -> int:
        """CUPTI's CRC of a cubin (``cuptiGetCubinCrc``), as PC sampling and SASS records report it."""
        try:
            return cubin_api.cubin_crc_at(cubin, size)
        except library.CuptiError:
            return 0
