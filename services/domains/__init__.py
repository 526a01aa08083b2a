"""Task domains: what a domain is, the built-in ones, and loading hundreds from one config.

::

    registry = load_registry(None)             # the built-in domains
    registry = load_registry(Path("deploy/domains"))
    tasks = registry.get("arithmetic").make_tasks(64, split="train", seed=0)
"""

from services.domains.api import (
    SPLITS,
    Domain,
    DomainError,
    Example,
    Problem,
    PromptFormat,
    Split,
    TaskSource,
    UnknownDomain,
    ValidatorSpec,
)
from services.domains.config import ConfigError
from services.domains.registry import ENTRY_POINT_GROUP, DomainRegistry, load_registry

__all__ = [
    "ENTRY_POINT_GROUP",
    "SPLITS",
    "ConfigError",
    "Domain",
    "DomainError",
    "DomainRegistry",
    "Example",
    "Problem",
    "PromptFormat",
    "Split",
    "TaskSource",
    "UnknownDomain",
    "ValidatorSpec",
    "load_registry",
]
