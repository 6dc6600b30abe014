"""What an XID's message says, where the catalog says the message decides (pure).

Two decoders, each driven by a table:

- ``recovery_action`` (XID 154): ``GPU recovery action changed from 0x0 (None) to 0x2 (Node
  Reboot Required)``, through :mod:`gpuhealth.agent.health.recovery_action`'s rows.
- ``nvlink5`` (XIDs 144-150): ``RLW_SRC_TRACK Nonfatal XC1 i0 Link 17 (0x04084507 0x00000004
  …)``: unit mnemonic, the driver's Fatal/Nonfatal, intrinfo (bits 20-25: sub-code) and the
  error status, matched against NVIDIA's decode sheet. Where the driver says ``Nonfatal`` and
  the sheet's row would taint hard, the driver's word caps the verdict (soft, never hard).

Each returns ``(action, severity, detail)`` or ``None`` when the message says nothing it
knows; the catalog then keeps the XID's own row.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpuhealth.agent.health import recovery_action as recovery_actions

Severity = Literal["healthy", "degraded", "unhealthy"]
Decoded = tuple[str, Severity, str]
"""(action, severity, what the message said, for the condition's text)."""

_WORDS = {"Fatal": "Fatal", "Nonfatal": "Nonfatal", "Non-fatal": "Nonfatal"}
"""The driver's severity word, as NVLink5 XIDs (and NVSwitch SXids: ``Non-fatal``) print it."""
_HEX = re.compile(r"0x([0-9a-fA-F]{1,8})\b")
_SUBCODE_SHIFT = 20
_SUBCODE_MASK = 0x3F


@dataclass(frozen=True, slots=True)
class Nvlink5Rule:
    xid: int
    units: frozenset[str]
    status: int
    subcode: int | None
    action: str
    fatal: bool


@dataclass(frozen=True, slots=True)
class DecodeTables:
    nvlink5: Mapping[tuple[int, str], Sequence[Nvlink5Rule]]
    """(xid, unit alias) -> the rules naming that unit."""
    decode_severity: Mapping[str, Severity]
    nvlink5_unlisted: Mapping[str, str]
    """The driver's word (``Fatal`` / ``Nonfatal``) -> action, for a message no rule matches."""
    nvlink5_driver_nonfatal: str
    """The action of a message the driver calls ``Nonfatal`` that the sheet's row would taint
    hard (never a hard verdict)."""
    action_rank: Mapping[str, int]


def rank(tables: DecodeTables, severity: Severity, action: str) -> tuple[int, int]:
    """Order of verdicts: severity first, then how drastic the action is."""
    sev = {"healthy": 0, "degraded": 1, "unhealthy": 2}[severity]
    return (sev, tables.action_rank.get(action, -1))


# ----------------------------------------------------------------- XID 154


def recovery_action(message: str) -> Decoded | None:
    """``… to 0x2 (Node Reboot Required)`` (the kernel) or ``… is 0x2 (…)`` (the NVML source,
    which reads the recovery-action field with the event): the rows of
    :mod:`gpuhealth.agent.health.recovery_action`, the one table of those actions."""
    row = recovery_actions.parse_message(message)
    if row is None:
        return None
    return (row.action, row.severity, f"recovery action {row.label}")


# ----------------------------------------------------------------- NVLink5


@dataclass(frozen=True, slots=True)
class Nvlink5Message:
    unit: str
    word: str | None
    """``Fatal`` / ``Nonfatal`` as the driver printed it."""
    intrinfo: int | None
    status: int | None


def split_nvlink5(message: str) -> Nvlink5Message | None:
    tokens = message.split(None, 2)
    if not tokens or tokens[0].startswith("0x"):
        return None
    word = _WORDS.get(tokens[1]) if len(tokens) > 1 else None
    paren = message.find("(")
    hexes = [int(h, 16) for h in _HEX.findall(message[paren:])] if paren >= 0 else []
    return Nvlink5Message(
        unit=tokens[0],
        word=word,
        intrinfo=hexes[0] if hexes else None,
        status=hexes[1] if len(hexes) > 1 else None,
    )


def _matching(rules: Sequence[Nvlink5Rule], msg: Nvlink5Message) -> list[Nvlink5Rule]:
    if msg.status is None:
        return []
    sub = None if msg.intrinfo is None else (msg.intrinfo >> _SUBCODE_SHIFT) & _SUBCODE_MASK
    rules = [r for r in rules if r.subcode is None or r.subcode == sub]
    exact = [r for r in rules if r.status == msg.status]
    if exact or msg.status == 0:
        return exact
    out: list[Nvlink5Rule] = []
    for bit in range(32):
        mask = 1 << bit
        if not msg.status & mask:
            continue
        hit = [r for r in rules if r.status == mask]
        if not hit:
            return []  # a bit the sheet does not list: the message is not fully understood
        out += hit
    return out


def nvlink5(tables: DecodeTables, xid: int, message: str) -> Decoded | None:
    msg = split_nvlink5(message)
    if msg is None:
        return None
    rules: list[Nvlink5Rule] = []
    for alias in msg.unit.split("/"):
        for r in tables.nvlink5.get((xid, alias), ()):
            if r not in rules:
                rules.append(r)
    matched = _matching(rules, msg) if rules else []
    status = "" if msg.status is None else f" status 0x{msg.status:08x}"
    if matched:
        worst = max(matched, key=lambda r: rank(tables, tables.decode_severity[r.action], r.action))
        sev = tables.decode_severity[worst.action]
        kind = "fatal" if worst.fatal else "non-fatal"
        if msg.word == "Nonfatal" and sev == "unhealthy":
            # The driver says non-fatal: the sheet alone does not taint hard. A second signal
            # (a Fatal line of this XID, XID 154, NVML's reset-required) raises its own verdict.
            action = tables.nvlink5_driver_nonfatal
            detail = (
                f"NVLink5 {msg.unit}{status}: {kind} per NVIDIA's decode ({worst.action}), "
                "the driver says Nonfatal"
            )
            return (action, tables.decode_severity[action], detail)
        return (worst.action, sev, f"NVLink5 {msg.unit}{status}: {kind} per NVIDIA's decode")
    if msg.word is None:
        return None
    action = tables.nvlink5_unlisted[msg.word]
    detail = f"NVLink5 {msg.unit}{status}: not in NVIDIA's decode, the driver says {msg.word}"
    return (action, tables.decode_severity[action], detail)
