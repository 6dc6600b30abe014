"""gpuhealth: GPU node health agent and Kubernetes taint controller.

The installed import names are ``gpuhealth.agent``, ``gpuhealth.controller``,
``gpuhealth.protocol`` and ``gpuhealth.common``. In the repository those packages live at the
top level (``agent/``, ``controller/``, ``protocol/``, ``common/``); the entries of this
directory are symbolic links to them, so the source tree, the editable install, mypy and the
wheel all see one package tree under one name (docs/architecture.md, "Packaging").
"""

__version__ = "0.1.0"
