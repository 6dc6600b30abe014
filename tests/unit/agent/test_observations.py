"""PCI addresses: every spelling the sources write parses to one canonical value."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.agent.observations import PciAddress


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("00000000:1B:00.0", "0000:1b:00.0"),  # NVML
        ("0000:1b:00", "0000:1b:00.0"),  # the kernel log
        ("0000:1B:00.1", "0000:1b:00.1"),
        ("1b:00.0", "0000:1b:00.0"),
        (" 00000001:2a:1f.7 ", "0001:2a:1f.7"),
        ("garbage", None),
        ("zz:yy:xx", None),
        ("0001:ab:cd", "0001:ab:cd.0"),  # seen in the corpus: taken as written
        ("0000:1b:100.0", None),  # device beyond two digits
        ("0000:1b:00.10", None),  # function beyond one digit
        ("0000:100:00.0", None),  # bus beyond 0xff
        ("0000::00.0", None),
        ("", None),
    ],
)
def test_parse(address: str, expected: str | None) -> None:
    parsed = PciAddress.parse(address)
    assert (None if parsed is None else str(parsed)) == expected


def test_spellings_of_one_address_are_equal() -> None:
    assert PciAddress.parse("00000000:1B:00.0") == PciAddress.parse("0000:1b:00")
    assert PciAddress.parse("0000:1b:00.1") != PciAddress.parse("0000:1b:00.0")


@given(st.text(max_size=40))
def test_parse_never_raises_and_round_trips(text: str) -> None:
    parsed = PciAddress.parse(text)
    if parsed is not None:
        assert PciAddress.parse(str(parsed)) == parsed
