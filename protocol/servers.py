"""A NATS URL as settings and the command line give it, turned into nats-py's server list.

One value names every server of a cluster, comma-separated (``TEMPER_NATS_URL``), the
way the Go and JavaScript clients read it; nats-py takes a list and fails over along it.
"""

from __future__ import annotations


class NoServersGiven(ValueError):
    """The URL names no server at all (empty, or only commas and blanks)."""


def server_list(url: str) -> list[str]:
    """The servers of a comma-separated URL, in order; a single URL gives a list of one."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise NoServersGiven(f"no NATS server in {url!r}")
    return servers
