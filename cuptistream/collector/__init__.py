"""The collector: a separate process that decodes what probes hand over and runs the pipeline.

``Collector`` owns the trio pipeline and every sink, accepts probes on a Unix socket (one thread
per probe connection), decodes activity buffers in bulk (``decoding``) and owns all loss
accounting. One collector can serve every probe on a host.
"""
