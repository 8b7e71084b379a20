"""cuptistream: continuous GPU telemetry on NVIDIA CUPTI."""
