"""Which sessions are open, on disk, so that a gateway killed with sessions open reports
them lost when it starts again: their calls were served but will never be trained on,
and an operator should see that rather than a silent gap.

One line per event (``open <id>``, ``end <id>``), appended and flushed to the disk as it
happens: a session opens once and ends once, so this costs two writes per session, not
per call.  Closed sessions need no journal: their rollouts were published with their ids
before the reward was answered, so they are on the bus once, whatever happens next.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO


class SessionJournal:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: IO[str] | None = None

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
        self._write(f"open {session_id}")

    def ended(self, session_id: str) -> None:
        self._write(f"end {session_id}")

    def _write(self, line: str) -> None:
        if self._file is None:
            return
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
