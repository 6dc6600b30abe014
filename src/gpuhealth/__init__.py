"""gpuhealth: GPU node health agent and Kubernetes taint controller.

Four subpackages: ``gpuhealth.agent`` (the node half), ``gpuhealth.controller`` (the cluster
half), ``gpuhealth.protocol`` (the wire between them) and ``gpuhealth.common`` (what both
follow). docs/architecture.md, "Packaging".
"""

__version__ = "0.1.0"
