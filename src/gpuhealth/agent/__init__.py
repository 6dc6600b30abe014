"""The node half of gpuhealth: sources observe, health decides, exporter and stream report."""

__version__ = "0.1.0"
