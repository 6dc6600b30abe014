"""Fleet-level incidents: what the controller decided is broken (a job, a GPU, an NVLink domain,
a GPU node nobody watches) and why. :mod:`.model` holds the record and the in-memory book."""

from gpuhealth.controller.incidents.model import (
    Incident,
    IncidentBook,
    IncidentKind,
    IncidentState,
    Subjects,
    incident_id,
)

__all__ = [
    "Incident",
    "IncidentBook",
    "IncidentKind",
    "IncidentState",
    "Subjects",
    "incident_id",
]
