"""Views of a recording: the summary tables, the trace export and the plots.

Each reads a recording (files or a Kafka topic) in one streaming pass, batch by batch, so memory
stays bounded whatever the recording's size (``records``); ``select`` holds the filters they share.
"""
