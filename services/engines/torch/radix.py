"""Radix-tree prefix cache: token-id sequences -> per-token KV tensors.

The tree is token-level (page size 1): every edge is a run of token ids and its node holds
one tensor whose ``seq_dim`` axis has exactly one slice per token of the edge, so a match
can end at any token and no KV is recomputed for lack of a full block.  For the torch engine
a node's tensor is ``[layers, 2 (K, V), kv_heads, tokens, head_dim]`` (``seq_dim=3``), but
the tree itself knows nothing about models: any tensor with a sequence axis works, which is
how the unit tests drive it with tiny integer tensors.

Memory is bounded in bytes (the sum of every node tensor's storage).  When an insert goes
over the bound, least-recently-used *leaves* are evicted; a parent whose last child leaves
becomes a leaf in turn.  Nodes on the path of a running request are pinned with
:meth:`RadixCache.lock` (a reference count on the node and every ancestor) and are never
evicted.  :meth:`RadixCache.clear` drops everything (weight change: old KV is stale).

Not thread-safe: the torch engine touches it only from its single worker thread.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(eq=False)
class Node:
    """One edge of the tree: ``key`` tokens and their KV ``value``."""

    key: tuple[int, ...]
    value: torch.Tensor | None
    parent: Node | None
    children: dict[int, Node] = field(default_factory=dict)
    #: Running requests whose matched/inserted path goes through this node.
    refs: int = 0
    #: Logical clock of the last match/insert that touched the node (LRU order).
    last_access: int = 0

    @property
    def nbytes(self) -> int:
        if self.value is None:
            return 0
        return self.value.numel() * self.value.element_size()

    def is_root(self) -> bool:
        return self.parent is None


@dataclass(frozen=True)
class Match:
    """Result of :meth:`RadixCache.match`."""

    #: Number of leading tokens whose KV was found.
    length: int
    #: KV of those tokens, concatenated along ``seq_dim`` (a fresh copy); None when length 0.
    value: torch.Tensor | None
    #: Deepest node of the match (the root when length 0): pass it to lock/unlock.
    node: Node


@dataclass(frozen=True, kw_only=True)
class RadixStatistics:
    #: match() calls that found at least one token / none.
    hits: int = 0
    misses: int = 0
    #: Tokens asked for in match() calls and tokens found.
    queried_tokens: int = 0
    hit_tokens: int = 0
    inserted_tokens: int = 0
    evicted_tokens: int = 0
    evicted_nodes: int = 0
    #: Current size.
    tokens: int = 0
    nbytes: int = 0
    nodes: int = 0
    max_bytes: int = 0


@dataclass
class _Counters:
    hits: int = 0
    misses: int = 0
    queried_tokens: int = 0
    hit_tokens: int = 0
    inserted_tokens: int = 0
    evicted_tokens: int = 0
    evicted_nodes: int = 0


class RadixCache:
    """Longest-prefix KV cache over token ids with a byte bound and LRU leaf eviction."""

    def __init__(self, max_bytes: int, *, seq_dim: int = 0) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.seq_dim = seq_dim
        self._clock = itertools.count(1)
        self._counters = _Counters()
        self._root = Node(key=(), value=None, parent=None)
        self._nbytes = 0
        self._tokens = 0
        self._nodes = 0

    # ------------------------------------------------------------------ queries

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def tokens(self) -> int:
        return self._tokens

    def match(self, tokens: Sequence[int]) -> Match:
        """The cached KV of the longest cached prefix of ``tokens``.

        A partial match inside an edge splits the edge, so the returned node covers
        exactly ``length`` tokens and can be locked on its own.
        """
        node, length, path = self._walk(tokens, split=True)
        now = next(self._clock)
        for visited in path:
            visited.last_access = now
        self._count_match(len(tokens), length)
        if length == 0:
            return Match(length=0, value=None, node=self._root)
        values = [n.value for n in path if n.value is not None]
        return Match(length=length, value=torch.cat(values, dim=self.seq_dim), node=node)

    def cached_length(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of ``tokens`` are cached: a look only (no statistics,
        no recency, no split)."""
        return self._walk(tokens, split=False)[1]

    def statistics(self) -> RadixStatistics:
        c = self._counters
        return RadixStatistics(
            hits=c.hits,
            misses=c.misses,
            queried_tokens=c.queried_tokens,
            hit_tokens=c.hit_tokens,
            inserted_tokens=c.inserted_tokens,
            evicted_tokens=c.evicted_tokens,
            evicted_nodes=c.evicted_nodes,
            tokens=self._tokens,
            nbytes=self._nbytes,
            nodes=self._nodes,
            max_bytes=self.max_bytes,
        )

    # ------------------------------------------------------------------ updates

    def insert(self, tokens: Sequence[int], value: torch.Tensor, *, offset: int = 0) -> Node:
        """Store the KV of ``tokens``; ``value`` covers ``tokens[offset:]`` along ``seq_dim``.

        ``offset`` lets a caller that holds (and has locked) ``tokens[:offset]`` in the tree
        pass only the new part.  The part already cached is kept as is (same tokens, same
        weights: same KV up to rounding); only the new suffix is stored.  If the tree lacks
        some of ``tokens[:offset]`` (evicted), nothing is stored: the value cannot fill the
        gap.  Returns the deepest node covering the stored prefix of ``tokens`` (the root
        when none); an unlocked new node may be evicted at once if the bound is too small.
        The tree may keep ``value`` itself (no copy) when it stores all of it.
        """
        if value.shape[self.seq_dim] != len(tokens) - offset:
            raise ValueError(
                f"value has {value.shape[self.seq_dim]} positions for {len(tokens) - offset} tokens"
            )
        node, length, path = self._walk(tokens, split=True)
        now = next(self._clock)
        for visited in path:
            visited.last_access = now
        if offset <= length < len(tokens):
            own = value.narrow(self.seq_dim, length - offset, len(tokens) - length)
            node = self._add_leaf(node, tuple(tokens[length:]), own, now)
        self.evict(self._nbytes - self.max_bytes)
        return node

    def lock(self, node: Node) -> None:
        """Pin ``node`` and its ancestors against eviction (a running request uses them)."""
        current: Node | None = node
        while current is not None:
            current.refs += 1
            current = current.parent

    def unlock(self, node: Node) -> None:
        current: Node | None = node
        while current is not None:
            if current.refs <= 0:
                raise RuntimeError("unlock without a matching lock")
            current.refs -= 1
            current = current.parent

    def evict(self, nbytes: int) -> int:
        """Evict unlocked LRU leaves until ``nbytes`` bytes are freed (or none is left)."""
        if nbytes <= 0:
            return 0
        heap = [(n.last_access, id(n), n) for n in self._evictable_leaves()]
        heapq.heapify(heap)
        freed = 0
        while freed < nbytes and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            freed += self._remove_leaf(leaf)
            if parent is not None and self._is_evictable_leaf(parent):
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def clear(self) -> None:
        """Drop every entry (statistics counters are kept)."""
        evicted = self._tokens
        nodes = self._nodes
        self._root = Node(key=(), value=None, parent=None)
        self._nbytes = self._tokens = self._nodes = 0
        self._counters.evicted_tokens += evicted
        self._counters.evicted_nodes += nodes

    # ------------------------------------------------------------------ internals

    def _walk(self, tokens: Sequence[int], *, split: bool) -> tuple[Node, int, list[Node]]:
        """Descend along ``tokens``: (deepest node, matched length, nodes passed).

        A match that ends inside an edge splits it, or without ``split`` counts its
        tokens and stops above it (the deepest node then covers fewer than ``length``).
        """
        node = self._root
        length = 0
        path: list[Node] = []
        while length < len(tokens):
            child = node.children.get(tokens[length])
            if child is None:
                break
            common = common_prefix(child.key, tokens, length)
            if common < len(child.key):
                if not split:
                    length += common
                    break
                child = self._split(child, common)
            node = child
            path.append(node)
            length += common
        return node, length, path

    def _split(self, node: Node, at: int) -> Node:
        """Cut ``node``'s edge after ``at`` tokens; returns the new upper node.

        ``node`` keeps its identity (lower part) so that handles on it stay valid; the new
        parent inherits its reference count since every lock through ``node`` passes it.
        """
        assert node.parent is not None and node.value is not None and 0 < at < len(node.key)
        upper_value, lower_value = self._cut(node.value, at)
        upper = Node(
            key=node.key[:at],
            value=upper_value,
            parent=node.parent,
            refs=node.refs,
            last_access=node.last_access,
        )
        node.parent.children[upper.key[0]] = upper
        node.key = node.key[at:]
        node.value = lower_value
        node.parent = upper
        upper.children[node.key[0]] = node
        self._nodes += 1
        return upper

    def _cut(self, value: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Copies, not views: a view would pin the whole original storage and break the
        # byte accounting once either half is evicted.
        length = value.shape[self.seq_dim]
        upper = value.narrow(self.seq_dim, 0, at).clone()
        lower = value.narrow(self.seq_dim, at, length - at).clone()
        return upper, lower

    def _add_leaf(self, parent: Node, key: tuple[int, ...], own: torch.Tensor, now: int) -> Node:
        if own.untyped_storage().nbytes() > own.numel() * own.element_size():
            own = own.clone()  # a slice would pin (and under-count) its whole base storage
        leaf = Node(key=key, value=own, parent=parent, last_access=now)
        parent.children[key[0]] = leaf
        self._nbytes += leaf.nbytes
        self._tokens += len(key)
        self._nodes += 1
        self._counters.inserted_tokens += len(key)
        return leaf

    def _remove_leaf(self, leaf: Node) -> int:
        assert leaf.parent is not None and not leaf.children
        del leaf.parent.children[leaf.key[0]]
        freed = leaf.nbytes
        self._nbytes -= freed
        self._tokens -= len(leaf.key)
        self._nodes -= 1
        self._counters.evicted_tokens += len(leaf.key)
        self._counters.evicted_nodes += 1
        leaf.value = None
        return freed

    def _is_evictable_leaf(self, node: Node) -> bool:
        return not node.is_root() and not node.children and node.refs == 0

    def _evictable_leaves(self) -> list[Node]:
        leaves: list[Node] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if self._is_evictable_leaf(node):
                leaves.append(node)
        return leaves

    def _count_match(self, queried: int, found: int) -> None:
        c = self._counters
        c.queried_tokens += queried
        c.hit_tokens += found
        if found:
            c.hits += 1
        else:
            c.misses += 1


def common_prefix(key: Sequence[int], tokens: Sequence[int], start: int = 0) -> int:
    """Length of the common prefix of ``key`` and ``tokens[start:]``."""
    limit = min(len(key), len(tokens) - start)
    i = 0
    while i < limit and key[i] == tokens[start + i]:
        i += 1
    return i
