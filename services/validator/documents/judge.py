"""The ``doc_file`` validator: rebuild the report file from the task's seed, parse it, check.

Rendering and parsing a PDF takes a fraction of a second, so it runs in a thread and
its result is kept (a bounded LRU): a GRPO group's rollouts share one document, and
concurrent rollouts of the same one wait for a single parse.  With ``cache_dir`` set
the rendered files are also written there and read back on a later miss.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from protocol.messages import Rollout
from services.domains.documents.family import DocumentSpec, build
from services.domains.documents.render import render
from services.validator.base import InfraFailure, InvalidRollout, Verdict, reference
from services.validator.documents.checks import Tolerance, assess, total
from services.validator.documents.parse import DocumentUnreadable, ParsedDocument, parse


@dataclass
class DocumentCache:
    """Parsed documents by spec, at most ``size`` of them."""

    size: int = 32
    directory: Path | None = None
    _parsed: OrderedDict[DocumentSpec, ParsedDocument] = field(
        default_factory=OrderedDict, init=False
    )
    #: One lock per document being parsed: concurrent rollouts wait for one parse.
    _locks: dict[DocumentSpec, asyncio.Lock] = field(default_factory=dict, init=False)

    def source(self, spec: DocumentSpec) -> bytes:
        """The file's bytes: from the cache folder if written before, else rendered."""
        if self.directory is None:
            return render(build(spec)[0], spec.fmt)
        path = self.directory / f"{spec.length}-{spec.kind}-{spec.seed}.{spec.fmt}"
        if path.exists():
            return path.read_bytes()
        data = render(build(spec)[0], spec.fmt)
        self.directory.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed: a reader never sees half a file.
        partial = path.with_suffix(path.suffix + ".part")
        partial.write_bytes(data)
        partial.replace(path)
        return data

    def load(self, spec: DocumentSpec) -> ParsedDocument:
        try:
            return parse(self.source(spec), spec.fmt)
        except DocumentUnreadable:
            raise
        except Exception as error:  # pdfminer raises its own zoo of errors on a bad file
            raise DocumentUnreadable(f"{type(error).__name__}: {error}") from error

    async def get(self, spec: DocumentSpec) -> ParsedDocument:
        found = self._parsed.get(spec)
        if found is not None:
            self._parsed.move_to_end(spec)
            return found
        lock = self._locks.setdefault(spec, asyncio.Lock())
        try:
            async with lock:
                found = self._parsed.get(spec)
                if found is None:
                    found = await asyncio.to_thread(self.load, spec)
                    self._parsed[spec] = found
                    while len(self._parsed) > self.size:
                        self._parsed.popitem(last=False)
        finally:
            # A failed parse leaves no lock behind; the next rollout tries again.
            self._locks.pop(spec, None)
        return found


@dataclass(frozen=True)
class DocumentFileQA:
    """Score: a right answer 0.6 plus up to 0.4 for its citations; a wrong number at most
    0.1 for its citations; no answer 0 (:mod:`services.validator.documents.checks`)."""

    rel_tol: float = 0.005
    abs_tol: float = 0.01
    cache: DocumentCache = field(default_factory=DocumentCache)

    async def score(self, rollout: Rollout) -> Verdict:
        task = rollout.task
        value = reference(task, "document")
        try:
            spec = DocumentSpec.from_metadata(value if isinstance(value, dict) else {})
        except ValueError as error:
            raise InvalidRollout(f"task {task.id}: metadata['document']: {error}") from None
        try:
            document = await self.cache.get(spec)
            assessment = assess(
                rollout.completion_text,
                document,
                build(spec)[1],
                Tolerance(self.rel_tol, self.abs_tol),
            )
        except DocumentUnreadable as error:
            raise InfraFailure(f"document {spec.as_metadata()} unreadable: {error}") from None
        return Verdict(*total(assessment))
