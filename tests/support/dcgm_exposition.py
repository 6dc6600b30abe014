"""dcgm-exporter's /metrics text, written the way dcgm-exporter writes it.

The shape follows dcgm-exporter's own template (internal/pkg/rendermetrics): per field a
``# HELP`` and ``# TYPE`` line, then one line per entity with the labels in its order
(``gpu``, ``UUID`` (``uuid`` with --use-old-namespace), ``pci_bus_id``, ``device``,
``modelName``, ``GPU_I_PROFILE``/``GPU_I_ID`` for a MIG GPU instance, ``Hostname`` (3.x) or
``hostname`` (4.x), then the label fields such as ``DCGM_FI_DRIVER_VERSION`` and the
attributes ``container``/``namespace``/``pod`` (or ``container_name``/``pod_name``/
``pod_namespace``), ``err_code``/``err_msg`` in key order); integers printed with ``%d`` and
doubles with ``%f``. Shared GPUs repeat every line per pod (Kubernetes mode with
time-slicing); MIG GPUs add one line per GPU instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HELP = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": ("gauge", "Slowdown temperature (in C)."),
    "DCGM_FI_DEV_SHUTDOWN_TEMP": ("gauge", "Shutdown temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (
        "counter",
        "Total energy consumption since boot (in mJ).",
    ),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_ENC_UTIL": ("gauge", "Encoder utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("gauge", "Current clock throttle reasons."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Total number of single-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": (
        "counter",
        "Total number of single-bit persistent ECC errors.",
    ),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": (
        "counter",
        "Total number of double-bit persistent ECC errors.",
    ),
    "DCGM_FI_DEV_RETIRED_SBE": ("counter", "Retired pages due to single-bit errors."),
    "DCGM_FI_DEV_RETIRED_DBE": ("counter", "Retired pages due to double-bit errors."),
    "DCGM_FI_DEV_RETIRED_PENDING": ("counter", "Total number of pages pending retirement."),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": (
        "counter",
        "Total number of NVLink flow-control CRC errors.",
    ),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": (
        "counter",
        "Total number of NVLink data CRC errors.",
    ),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink retries."),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": (
        "counter",
        "Total number of NVLink recovery errors.",
    ),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gauge", "Whether remapping of rows is pending"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
}
DOUBLES = frozenset(
    {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
)  # DCGM_FT_DOUBLE fields: printed with %f
INSTANCE_FIELDS = frozenset(
    {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
)
XID_TEXT = {0: "No Error", 13: "Graphics Engine Exception", 48: "DBE (Double Bit Error) ECC Error",
            79: "GPU has fallen off the bus"}  # fmt: skip


@dataclass
class Instance:
    gi: int
    profile: str
    values: dict[str, float] = field(default_factory=dict)
    """Instance-level values (framebuffer, engine activity)."""


@dataclass
class Gpu:
    index: int
    uuid: str
    pci_bus_id: str
    values: dict[str, float]
    pods: list[tuple[str, str, str]] = field(default_factory=list)
    """(namespace, pod, container) sharing this GPU: every line is repeated per pod."""
    instances: list[Instance] = field(default_factory=list)
    model: str = "NVIDIA H100 80GB HBM3"


def healthy_values(**over: float) -> dict[str, float]:
    v: dict[str, float] = {
        "DCGM_FI_DEV_SM_CLOCK": 1980,
        "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_MEMORY_TEMP": 52,
        "DCGM_FI_DEV_GPU_TEMP": 45,
        "DCGM_FI_DEV_SLOWDOWN_TEMP": 87,
        "DCGM_FI_DEV_SHUTDOWN_TEMP": 92,
        "DCGM_FI_DEV_POWER_USAGE": 351.25,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 4335301032,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
        "DCGM_FI_DEV_GPU_UTIL": 87,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 41,
        "DCGM_FI_DEV_ENC_UTIL": 0,
        "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0,
        "DCGM_FI_DEV_FB_FREE": 60000,
        "DCGM_FI_DEV_FB_USED": 21559,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 0,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 0,
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 0,
        "DCGM_FI_DEV_RETIRED_SBE": 0,
        "DCGM_FI_DEV_RETIRED_DBE": 0,
        "DCGM_FI_DEV_RETIRED_PENDING": 0,
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 0,
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 0,
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 0,
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": 0,
    }
    v.update(over)
    return v


def gpu(i: int, **values: float) -> Gpu:
    return Gpu(
        index=i,
        uuid=f"GPU-5a8b0c1d-{i:04x}-4000-8000-{i:012x}",
        pci_bus_id=f"00000000:{0x18 + 0x11 * i:02X}:00.0",
        values=healthy_values(**values),
    )


def render(
    gpus: list[Gpu],
    *,
    hostname: str = "Hostname",
    old_namespace: bool = False,
    driver: str = "570.133.20",
    fields: list[str] | None = None,
) -> str:
    """The exposition of ``gpus``; ``fields``: the counters CSV (default: every known)."""
    uuid_label = "uuid" if old_namespace else "UUID"
    pod_keys = (
        ("container_name", "pod_name", "pod_namespace")
        if old_namespace
        else ("container", "namespace", "pod")
    )
    out: list[str] = []
    for name in fields or list(HELP):
        kind, help_ = HELP[name]
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        for g in gpus:
            entities: list[tuple[Instance | None, float | None]] = []
            if name in g.values:
                entities.append((None, g.values[name]))
            for inst in g.instances:
                v = inst.values.get(name, None if name in INSTANCE_FIELDS else g.values.get(name))
                if v is not None:
                    entities.append((inst, v))
            for inst, value in entities:
                base = (
                    f'gpu="{g.index}",{uuid_label}="{g.uuid}",pci_bus_id="{g.pci_bus_id}",'
                    f'device="nvidia{g.index}",modelName="{g.model}"'
                )
                if inst is not None:
                    base += f',GPU_I_PROFILE="{inst.profile}",GPU_I_ID="{inst.gi}"'
                base += f',{hostname}="gpu-node-7",DCGM_FI_DRIVER_VERSION="{driver}"'
                attrs: dict[str, str] = {}
                if name == "DCGM_FI_DEV_XID_ERRORS":
                    attrs["err_code"] = str(int(value))
                    attrs["err_msg"] = XID_TEXT.get(int(value), "Unknown Error")
                pods = g.pods if inst is None and g.pods else [None]
                for pod in pods:
                    a = dict(attrs)
                    if pod is not None:
                        ns, pod_name, container = pod
                        a.update(
                            zip(
                                pod_keys,
                                (container, ns, pod_name)
                                if not old_namespace
                                else (container, pod_name, ns),
                                strict=True,
                            )
                        )
                    labels = base + "".join(f',{k}="{v}"' for k, v in sorted(a.items()))
                    text = f"{value:f}" if name in DOUBLES else f"{int(value)}"
                    out.append(f"{name}{{{labels}}} {text}")
    return "\n".join(out) + "\n"
