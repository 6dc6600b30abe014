"""Observation sources: NVML, kernel log, dcgm-exporter scrape, simulator."""
