"""PCI addresses in any spelling, and the address -> UUID lookup from the inventory."""

from __future__ import annotations

import pytest

from gpuhealth.agent.observations import Inventory
from gpuhealth.agent.sources.pci import normalize_pci, pci_lookup
from tests.support.agent import engine_with, identity, uuid


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("00000000:1B:00.0", "0000:1b:00.0"),
        ("0000:1b:00", "0000:1b:00.0"),
        ("0000:1B:00.1", "0000:1b:00.1"),
        ("1b:00.0", "0000:1b:00.0"),
        ("garbage", None),
        ("zz:yy:xx", None),
    ],
)
def test_normalize_pci(address: str, expected: str | None) -> None:
    assert normalize_pci(address) == expected


def test_pci_lookup_follows_inventory() -> None:
    engine = engine_with(2)
    lookup = pci_lookup(engine)
    assert lookup("0000:19:00") == uuid(1)
    assert lookup("0000:99:00") is None
    engine.inv = Inventory(source="sim", gpus=(identity(0),))
    assert lookup("0000:19:00") is None
    engine.inv = None
    assert lookup("0000:18:00") is None
