"""Per-domain figures on the stats subject: figure ``f`` of domain ``d`` is ``domain.<d>.<f>``
(the validator's rates, the feeder's draw and pools)."""

from __future__ import annotations

from collections.abc import Mapping

#: A domain's figure ``f`` of domain ``d`` is the stats value ``domain.<d>.<f>``.
PREFIX = "domain"


def key(domain: str, figure: str) -> str:
    return f"{PREFIX}.{domain}.{figure}"


def by_domain(values: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """The feeder's stats values as {domain: {figure: value}}."""
    domains: dict[str, dict[str, float]] = {}
    for name, value in values.items():
        head, _, figure = name.rpartition(".")
        prefix, _, domain = head.partition(".")
        if prefix == PREFIX and domain:
            domains.setdefault(domain, {})[figure] = value
    return domains
