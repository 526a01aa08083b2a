"""Which sessions are open, on disk, so that a gateway killed with sessions open reports
them lost when it starts again: their calls were served but will never be trained on,
and an operator should see that rather than a silent gap.

One line per event (``open <id>``, ``end <id>``), appended and handed to the operating
system as it happens: a session opens once and ends once, so this costs two writes per
session, not per call.  A write the process made survives its ``kill -9`` without an
``fsync`` (the kernel holds it); only a crash of the whole machine could lose the last
lines, and then every session was lost with the machine anyway.  An fsync per session on
the event loop cost a sixth of the gateway's CPU in ``bench/bench_gateway.py``.

The file is rewritten with only the open sessions once it holds ``compact_after`` lines
(and twice as many as are open),
so that a long-running gateway's journal stays the size of what is open.  Closed sessions
need no journal: their rollouts were published with their ids before the reward was
answered, so they are on the bus once, whatever happens next.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO


class SessionJournal:
    def __init__(self, path: Path | None, compact_after: int = 100_000) -> None:
        self.path = path
        self.compact_after = compact_after
        self._file: IO[str] | None = None
        self._open: set[str] = set()
        self._lines = 0

    def recover(self) -> int:
        """Sessions a previous run left open (lost with it); the journal starts afresh."""
        if self.path is None:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        open_ids: set[str] = set()
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                event, _, session = line.partition(" ")
                if event == "open":
                    open_ids.add(session)
                elif event == "end":
                    open_ids.discard(session)
        self._file = self.path.open("w")
        return len(open_ids)

    def opened(self, session_id: str) -> None:
        self._open.add(session_id)
        self._write(f"open {session_id}")

    def ended(self, session_id: str) -> None:
        self._open.discard(session_id)
        self._write(f"end {session_id}")

    def _write(self, line: str) -> None:
        if self._file is None:
            return
        # At least twice what is open: compacting costs a line per open session.
        if self._lines >= max(self.compact_after, 2 * len(self._open)):
            self._compact()
        self._file.write(line + "\n")
        self._file.flush()
        self._lines += 1

    def _compact(self) -> None:
        """Replace the journal by the open sessions alone (atomically: a kill midway leaves
        the old journal or the new one, never half of one)."""
        assert self.path is not None and self._file is not None
        fresh = self.path.with_suffix(".compacting")
        fresh.write_text("".join(f"open {session}\n" for session in sorted(self._open)))
        self._file.close()
        os.replace(fresh, self.path)
        self._file = self.path.open("a")
        self._lines = len(self._open)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
