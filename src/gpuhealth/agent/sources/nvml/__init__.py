"""The NVML source: per-GPU samples, NVML's event set, GPU Operational Events, CPER records."""
