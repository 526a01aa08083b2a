"""The radix-tree prefix cache, with integer tensors standing in for KV.

A token's value is ``position * 4096 + token`` (float64, 8 bytes), a pure function of where
the token sits, so whatever was inserted first, a correct match returns exactly
``expected(tokens[:length])``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.engines.torch.radix import Node, RadixCache

BYTES_PER_TOKEN = 8


def kv(tokens: list[int], start: int = 0) -> torch.Tensor:
    """Values of ``tokens[start:]`` at their positions in ``tokens``."""
    return torch.tensor(
        [pos * 4096 + tok for pos, tok in enumerate(tokens)][start:], dtype=torch.float64
    )


def assert_match(cache: RadixCache, tokens: list[int], length: int) -> None:
    found = cache.match(tokens)
    assert found.length == length
    if length:
        assert found.value is not None
        assert torch.equal(found.value, kv(tokens[:length]))
    else:
        assert found.value is None


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_empty_cache_misses() -> None:
    cache = RadixCache(1 << 20)
    assert_match(cache, [1, 2, 3], 0)
    stats = cache.statistics()
    assert (stats.hits, stats.misses, stats.queried_tokens, stats.hit_tokens) == (0, 1, 3, 0)


def test_insert_then_longest_prefix() -> None:
    cache = RadixCache(1 << 20)
    cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    assert_match(cache, [1, 2, 3, 4, 5, 6], 4)
    assert_match(cache, [1, 2, 3, 4], 4)
    assert_match(cache, [1, 2, 9], 2)
    assert_match(cache, [2, 3], 0)
    assert cache.tokens == 4
    assert cache.nbytes == 4 * BYTES_PER_TOKEN


def test_cached_length_looks_without_touching() -> None:
    cache = RadixCache(1 << 20)
    cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    cache.insert([1, 2, 7], kv([1, 2, 7]))
    before = cache.statistics()
    # Inside an edge (no split), at a branch, past the end, and a miss.
    assert [cache.cached_length(t) for t in ([1, 2, 3], [1, 2], [1, 2, 3, 4, 5], [9])] == [
        3,
        2,
        4,
        0,
    ]
    assert cache.statistics() == before  # no hits or misses counted, no node split


def test_partial_match_splits_the_edge() -> None:
    cache = RadixCache(1 << 20)
    cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    found = cache.match([1, 2, 7])
    assert found.node.key == (1, 2)
    assert cache.statistics().nodes == 2
    assert cache.tokens == 4 and cache.nbytes == 4 * BYTES_PER_TOKEN
    assert_match(cache, [1, 2, 3, 4], 4)


def test_branches_share_their_prefix() -> None:
    cache = RadixCache(1 << 20)
    cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    cache.insert([1, 2, 5, 6, 7], kv([1, 2, 5, 6, 7]))
    assert cache.tokens == 7  # 1 2 | 3 4 | 5 6 7
    assert_match(cache, [1, 2, 5, 6, 7, 8], 5)
    assert_match(cache, [1, 2, 3, 4], 4)
    assert cache.statistics().inserted_tokens == 7


def test_insert_with_offset_stores_only_the_new_part() -> None:
    cache = RadixCache(1 << 20)
    prompt = [1, 2, 3]
    cache.insert(prompt, kv(prompt))
    turn = [*prompt, 4, 5]
    cache.insert(turn, kv(turn, start=3), offset=3)
    assert_match(cache, turn, 5)


def test_insert_with_offset_past_a_gap_stores_nothing() -> None:
    cache = RadixCache(1 << 20)
    node = cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4], start=2), offset=2)
    assert node.is_root()
    assert cache.tokens == 0


def test_insert_rejects_a_value_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="positions"):
        RadixCache(1 << 20).insert([1, 2, 3], kv([1, 2]))


def test_stored_value_does_not_pin_a_larger_base() -> None:
    cache = RadixCache(1 << 20)
    base = kv(list(range(100)))
    cache.insert([7, 8], base[:2])
    found = cache.match([7, 8])
    assert found.node.value is not None
    assert found.node.value.untyped_storage().nbytes() == 2 * BYTES_PER_TOKEN


def test_bound_evicts_least_recently_used_leaf() -> None:
    cache = RadixCache(8 * BYTES_PER_TOKEN)
    cache.insert([1, 1, 1, 1], kv([1, 1, 1, 1]))
    cache.insert([2, 2, 2, 2], kv([2, 2, 2, 2]))
    cache.match([1, 1, 1, 1, 5])  # 1... is now more recent than 2...
    cache.insert([3, 3, 3, 3], kv([3, 3, 3, 3]))
    assert_match(cache, [2, 2, 2, 2], 0)
    assert_match(cache, [1, 1, 1, 1], 4)
    assert_match(cache, [3, 3, 3, 3], 4)
    stats = cache.statistics()
    assert stats.nbytes <= 8 * BYTES_PER_TOKEN
    assert stats.evicted_tokens == 4 and stats.evicted_nodes == 1


def test_eviction_climbs_to_parents_that_become_leaves() -> None:
    cache = RadixCache(1 << 20)
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    cache.insert([1, 2, 4], kv([1, 2, 4]))
    assert cache.evict(1 << 20) == 4 * BYTES_PER_TOKEN
    assert cache.tokens == 0 and cache.statistics().nodes == 0


def test_locked_path_is_never_evicted() -> None:
    cache = RadixCache(1 << 20)
    node = cache.insert([1, 2, 3], kv([1, 2, 3]))
    cache.insert([1, 2, 9, 9], kv([1, 2, 9, 9]))
    cache.lock(node)
    cache.evict(1 << 20)
    assert_match(cache, [1, 2, 3], 3)
    assert_match(cache, [1, 2, 9, 9], 2)
    cache.unlock(node)
    cache.evict(1 << 20)
    assert cache.tokens == 0


def test_split_keeps_locks_consistent() -> None:
    cache = RadixCache(1 << 20)
    node = cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    cache.lock(node)
    upper = cache.match([1, 2]).node  # splits the locked edge
    assert upper.refs == 1 and node.parent is upper
    cache.unlock(node)
    assert upper.refs == 0 and node.refs == 0
    with pytest.raises(RuntimeError, match="unlock"):
        cache.unlock(node)


def test_insert_over_a_tiny_bound_keeps_nothing_unlocked() -> None:
    cache = RadixCache(2 * BYTES_PER_TOKEN)
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    assert cache.nbytes == 0
    assert_match(cache, [1, 2, 3], 0)


def test_zero_bound_caches_nothing() -> None:
    cache = RadixCache(0)
    cache.insert([1, 2], kv([1, 2]))
    assert cache.tokens == 0


def test_clear_drops_everything_and_counts_it() -> None:
    cache = RadixCache(1 << 20)
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    cache.clear()
    assert_match(cache, [1, 2, 3], 0)
    stats = cache.statistics()
    assert (stats.tokens, stats.nbytes, stats.nodes, stats.evicted_tokens) == (0, 0, 0, 3)


def test_statistics_count_hits_and_misses() -> None:
    cache = RadixCache(1 << 20)
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    cache.match([1, 2, 3, 4])
    cache.match([5])
    stats = cache.statistics()
    assert (stats.hits, stats.misses, stats.queried_tokens, stats.hit_tokens) == (1, 1, 5, 3)


def test_multidimensional_values_use_seq_dim() -> None:
    cache = RadixCache(1 << 20, seq_dim=1)
    value = torch.arange(2 * 5 * 3).reshape(2, 5, 3)
    cache.insert([1, 2, 3, 4, 5], value)
    found = cache.match([1, 2, 3, 9])
    assert found.value is not None
    assert torch.equal(found.value, value[:, :3])


# ---------------------------------------------------------------------- properties

sequences = st.lists(st.integers(0, 3), min_size=0, max_size=12)
operations = st.lists(st.tuples(st.sampled_from(["insert", "match"]), sequences), max_size=40)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_unbounded_matches_a_naive_model(ops: list[tuple[str, list[int]]]) -> None:
    """Without a bound the longest match is the longest common prefix with any insert."""
    cache = RadixCache(1 << 30)
    inserted: list[list[int]] = []
    for op, tokens in ops:
        if op == "insert":
            cache.insert(tokens, kv(tokens))
            inserted.append(tokens)
        else:
            assert_match(cache, tokens, max((lcp(s, tokens) for s in inserted), default=0))
    assert cache.tokens == len({tuple(s[:i]) for s in inserted for i in range(1, len(s) + 1)})
    assert cache.nbytes == cache.tokens * BYTES_PER_TOKEN


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 24), operations, st.lists(st.integers(0, 39), max_size=5))
def test_bounded_stays_under_its_bound_and_correct(
    max_tokens: int, ops: list[tuple[str, list[int]]], lock_at: list[int]
) -> None:
    """Any match is a true prefix of something inserted, with the right values; the bound
    holds whenever nothing is locked; locked entries survive."""
    cache = RadixCache(max_tokens * BYTES_PER_TOKEN)
    inserted: list[list[int]] = []
    locked: list[tuple[Node, list[int], int]] = []
    for step, (op, tokens) in enumerate(ops):
        if op == "insert":
            node = cache.insert(tokens, kv(tokens))
            inserted.append(tokens)
            if step in lock_at and node.value is not None:
                cache.lock(node)
                locked.append((node, tokens, len(tokens)))
        else:
            found = cache.match(tokens)
            assert found.length <= max((lcp(s, tokens) for s in inserted), default=0)
            if found.length:
                assert found.value is not None
                assert torch.equal(found.value, kv(tokens[: found.length]))
        for _, held, length in locked:
            assert cache.match(held).length >= length
        if not locked:
            assert cache.nbytes <= cache.max_bytes
    for node, _, _ in locked:
        cache.unlock(node)
    cache.evict(cache.nbytes - cache.max_bytes)
    assert cache.nbytes <= cache.max_bytes
