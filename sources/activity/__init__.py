"""The activity source: CUPTI activity buffers, handed whole to the collector (``source``), traced
continuously (``activity.mode: full``) or in windows under the overhead budget (``windows``)."""

from .source import ActivitySource, ActivitySourceConfig

__all__ = ["ActivitySource", "ActivitySourceConfig"]
