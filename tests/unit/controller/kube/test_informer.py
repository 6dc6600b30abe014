"""The one informer's stream handling (pure parts; the LIST+WATCH loop itself runs against the
real API server in tests/integration/test_informer.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.controller.kube.informer import EventType, Informer
from gpuhealth.controller.kube.rest import GoneError, KubeError


class Sink:
    def __init__(self, fail: bool = False) -> None:
        self.events: list[tuple[EventType, str]] = []
        self.fail = fail

    def listed(self, items: list[dict[str, Any]], seen: set[str]) -> None:
        raise AssertionError("no LIST here")

    def list_complete(self, seen: set[str]) -> None:
        raise AssertionError("no LIST here")

    def apply(self, event: EventType, obj: dict[str, Any]) -> None:
        self.events.append((event, obj["metadata"]["name"]))
        if self.fail:
            raise ValueError("a sink bug")


def _informer(sink: Sink) -> Informer:
    return Informer(None, "/api/v1/things", sink, what="things")


def _line(kind: str, name: str, rv: str) -> bytes:
    return (
        f'{{"type":"{kind}","object":{{"metadata":{{"name":"{name}","resourceVersion":"{rv}"}}}}}}'
    ).encode()


def test_events_reach_the_sink_and_move_the_resume_point() -> None:
    sink = Sink()
    inf = _informer(sink)
    inf.on_line(_line("ADDED", "a", "10"))
    inf.on_line(_line("MODIFIED", "a", "11"))
    inf.on_line(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"20"}}}')
    assert inf.resource_version == "20"
    inf.on_line(_line("DELETED", "a", "21"))
    assert sink.events == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert inf.resource_version == "21"


@pytest.mark.parametrize(("code", "error"), [(410, GoneError), (500, KubeError), (403, KubeError)])
def test_an_error_event_is_our_error(code: int, error: type[Exception]) -> None:
    inf = _informer(Sink())
    inf.resume_from("5")
    line = f'{{"type":"ERROR","object":{{"kind":"Status","code":{code},"message":"x"}}}}'
    with pytest.raises(error):
        inf.on_line(line.encode())
    assert inf.resource_version == "5"


def test_a_failing_sink_does_not_stop_the_watch() -> None:
    sink = Sink(fail=True)
    inf = _informer(sink)
    inf.on_line(_line("ADDED", "a", "10"))
    inf.on_line(_line("ADDED", "b", "11"))
    assert sink.events == [("ADDED", "a"), ("ADDED", "b")] and inf.resource_version == "11"


def test_the_error_backoff_starts_again_after_an_event() -> None:
    inf = Informer(None, "/x", Sink(), what="things", rand=lambda: 0.5)
    first = inf._backoff.next_delay()
    assert inf._backoff.next_delay() == 2 * first
    inf.on_line(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"20"}}}')
    assert inf._backoff.next_delay() == first
