"""The dcgm-exporter source: a node-local exporter's Prometheus text scraped into samples."""
