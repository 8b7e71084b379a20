"""What every sink shares to deliver: the retry policy (``retry``: backoff, one deadline), the sink's
health (``health``: ok, failing, stopped, each change said once) and blocking calls abandoned at a
deadline (``abandonable``). The plug-in contract offers ``call_with_retry`` from here; the pipeline's
lanes keep the health."""
