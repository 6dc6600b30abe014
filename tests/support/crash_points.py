"""Every state a SIGKILL can leave a state store in: its writes, in order, between what the
test notes happened (a line handed on, an XID taken). A crash is taken right before the next
write, so everything noted until then happened; what was noted taken counts only up to the
write itself (its position is that write's)."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuhealth.agent.state_store import StateStore


@dataclass(frozen=True, slots=True)
class Crash:
    n: int
    document: bytes
    """The per-boot document as the write left it."""
    handed: frozenset[Hashable]
    """Noted ``handed`` before the next write."""
    taken: frozenset[Hashable]
    """Noted ``taken`` before this write."""

    def restore(self, state_dir: Path, name: str, boot_id: str) -> Path:
        """A fresh store in ``state_dir`` holding only this crash's document."""
        StateStore(state_dir).put_boot_value(name, boot_id, self.document)
        return state_dir


class WriteLog:
    def __init__(self, store: StateStore) -> None:
        self._events: list[tuple[str, object]] = []
        put = store.put_boot_value

        def recording(name: str, boot_id: str, value: bytes) -> bool:
            ok = put(name, boot_id, value)
            self._events.append(("write", value))
            return ok

        store.put_boot_value = recording  # type: ignore[method-assign]

    def note(self, kind: str, what: Hashable) -> None:
        self._events.append((kind, what))

    def count(self, kind: str) -> int:
        return sum(k == kind for k, _ in self._events)

    def crashes(self) -> Iterator[Crash]:
        events = self._events
        writes = [i for i, (k, _) in enumerate(events) if k == "write"]
        for n, i in enumerate(writes):
            upto = writes[n + 1] if n + 1 < len(writes) else len(events)
            doc = events[i][1]
            assert isinstance(doc, bytes)
            yield Crash(
                n,
                doc,
                handed=frozenset(x for k, x in events[:upto] if k == "handed"),  # type: ignore[misc]
                taken=frozenset(x for k, x in events[:i] if k == "taken"),  # type: ignore[misc]
            )
