"""NVML, the driver's management library, where CUPTI has no equivalent (``gpm``)."""
