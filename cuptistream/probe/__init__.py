"""The probe: what runs inside the observed process.

It starts the config's sources and hands their data to a collector process through shared memory
(``cuptistream.channel``): whole CUPTI activity buffers (no per-record work here) and the encoded
events of the sources that CUPTI makes live in the process (callbacks, state, PC sampling, SASS).
"""
