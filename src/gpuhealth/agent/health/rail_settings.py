"""When a rail (an InfiniBand or RoCE port beside the GPUs) is judged faulty: the
``rdma.rails`` section, read by :mod:`gpuhealth.agent.health.rails`.

Every rail verdict is soft by default (``degraded``: the controller's policy gives the node a
PreferNoSchedule taint) and hard (``unhealthy``: NoSchedule) where the operator sets its
``*_severity``. The counter names are the kernel's sysfs file names (``counters/`` and
``hw_counters/`` of ``/sys/class/infiniband/<device>/ports/<port>``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gpuhealth.common.config import PositiveInt, PositiveSeconds, Seconds, Settings

RailSeverity = Literal["degraded", "unhealthy"]
Gbps = Annotated[float, Meta(gt=0.0, le=100_000.0)]
"""A link rate in Gb/s (the kernel's ``rate`` file: ``400 Gb/sec (4X NDR)``)."""
PerSecond = Annotated[float, Meta(gt=0.0, le=1e9)]
HcaModel = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
"""The kernel's ``hca_type`` of an RDMA device (``MT4123``: ConnectX-6, ``MT4129``:
ConnectX-7)."""

LINK_DOWNED = "link_downed"
"""The port counter of link-down events (8 bits wide): the flap rule's counter."""

ErrorCounter = Literal[
    # counters/: the InfiniBand PortCounters (fixed width, they stop at their maximum)
    "symbol_error",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    # hw_counters/: the driver's own (mlx5), 64 bits wide
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "implied_nak_seq_err",
    "req_cqe_error",
    "resp_cqe_error",
    "rx_icrc_encapsulated",
    "roce_adp_retrans",
    "roce_slow_restart",
]
"""Every error counter the RDMA source reads (besides ``link_downed``) and exports; those
with a rate in ``error_rates_per_s`` are judged."""
ERROR_COUNTERS: tuple[str, ...] = ErrorCounter.__args__  # type: ignore[attr-defined]

DEFAULT_ERROR_RATES: dict[ErrorCounter, float] = {
    "symbol_error": 0.5,
    "link_error_recovery": 0.05,
    "port_rcv_errors": 0.5,
    "port_rcv_remote_physical_errors": 0.5,
    "local_link_integrity_errors": 0.05,
    "excessive_buffer_overrun_errors": 0.05,
}
"""The link-level errors judged by default: physical-layer symbol errors, link retraining,
received packets dropped for errors, integrity and buffer overruns. The ``hw_counters``
(transport and congestion events of applications) are exported, not judged, unless set."""


class RailSettings(Settings, frozen=True, kw_only=True):
    """Thresholds and hysteresis of the rail verdicts (``rail-down``, ``rail-flapping``,
    ``rail-degraded-rate``, ``rail-errors``), each raised on every GPU behind the port."""

    raise_after_samples: PositiveInt = 2
    """Consecutive bad polls (``rdma.poll_interval_s`` apart) before ``rail-down``,
    ``rail-degraded-rate`` or ``rail-errors`` is raised."""
    clean_window_s: Seconds = 300.0
    """Those verdicts clear after this many seconds without a bad poll."""
    down_severity: RailSeverity = "degraded"
    """``rail-down``: a port seen ACTIVE and LinkUp since the agent started is no longer both
    (a port never up, an unused one, raises nothing)."""
    expected_rate_gbps: dict[HcaModel, Gbps] = msgspec.field(default_factory=dict)
    """HCA type -> the rate its ports must negotiate, e.g. ``{MT4129: 400}``. A model not
    listed expects the most common rate among the node's up ports of the same link layer
    (no verdict when two rates are equally common)."""
    rate_severity: RailSeverity = "degraded"
    """``rail-degraded-rate``: an up port negotiated less than its expected rate."""
    flap_window_s: PositiveSeconds = 600.0
    """The sliding window flaps are counted in: ``link_downed`` increments, and downs seen by
    the polls (one event counted once)."""
    flap_threshold: PositiveInt = 2
    """``rail-flapping`` while at least this many flaps lie within ``flap_window_s``; it
    clears when they have aged out of it."""
    flapping_severity: RailSeverity = "degraded"
    """Severity of ``rail-flapping``."""
    error_rates_per_s: dict[ErrorCounter, PerSecond] = msgspec.field(
        default_factory=lambda: dict(DEFAULT_ERROR_RATES)
    )
    """Counter -> the growth per second between two polls that makes a poll bad for
    ``rail-errors``. A counter that goes backwards was reset (no growth that poll); one not
    listed is exported, not judged."""
    errors_severity: RailSeverity = "degraded"
    """Severity of ``rail-errors``."""
