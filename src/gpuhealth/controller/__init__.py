"""The cluster half of gpuhealth: stream server, fleet model, policy, reconciler, placement."""

__version__ = "0.1.0"
