"""The latest Stats of every service instance of a running stack, kept to be written out.

``temper train`` writes them to ``RUN_DIR/stats.json`` when it stops: the counters and
the seconds per stage (``time_<stage>_s``) of each process, for a benchmark or a user
to read where the time went.
"""

from __future__ import annotations

import json
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from protocol import subjects
from protocol.codec import Codec
from protocol.errors import DecodeError
from protocol.messages import Stats
from services.runtime.domain_figures import by_domain


class LastStats:
    def __init__(self) -> None:
        self.latest: dict[str, Stats] = {}
        self._codec: Codec[Stats] = Codec(Stats)

    async def start(self, nc: NATS) -> None:
        await nc.subscribe(subjects.stats_all(), cb=self._on_stats)

    async def _on_stats(self, msg: Msg) -> None:
        try:
            stats = self._codec.decode(msg.data)
        except DecodeError:
            return  # a read-only view of a broadcast: a malformed figure is left out, not fatal
        self.latest[f"{stats.service}/{stats.instance}"] = stats

    def write(self, path: Path) -> None:
        report = {
            key: {"service": s.service, "sent_at": s.sent_at, "values": s.values}
            for key, s in sorted(self.latest.items())
        }
        path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


#: The feeder's per-domain figures, in the order a line gives them.
_FED = ("drawn", "done", "in_flight", "filtered", "epoch", "pool_easy", "pool_normal", "pool_hard")


def fed_lines(stats: LastStats) -> list[str]:
    """One line per domain of what the feeder drew, from its last stats."""
    lines = []
    for entry in stats.latest.values():
        if entry.service != "feeder":
            continue
        for name, f in sorted(by_domain(entry.values).items()):
            got = {key: int(f.get(key, 0)) for key in _FED}
            lines.append(
                f"fed {name}: {got['drawn']} tasks drawn, {got['done']} done, "
                f"{got['in_flight']} in flight, {got['filtered']} filtered (all alike); "
                f"epoch {got['epoch']}, pools easy/normal/hard "
                f"{got['pool_easy']}/{got['pool_normal']}/{got['pool_hard']}"
            )
    return lines
