"""Prefilling several prompts in one pass: which prompts group, and the KV it leaves.

The engine tests check the whole path against fresh forward passes; these check the
grouping rule and the layout of the rows before and after ``Prefill.settle``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from services.engines.torch.batch import Batch, Prefill, RoomyLayer, prefill_groups

HEADS, DIM, LAYERS = 2, 4, 2


def one_row_cache(tokens: int, seed: int) -> DynamicCache:
    cache = DynamicCache()
    generator = torch.Generator().manual_seed(seed)
    for layer in range(LAYERS):
        keys = torch.randn(1, HEADS, tokens, DIM, generator=generator)
        cache.update(keys, keys + 100, layer)
    return cache


def test_prompts_of_similar_length_share_a_pass() -> None:
    assert prefill_groups([100, 96, 104, 90], max_tokens=8192, slack=0.25) == [[2, 0, 1, 3]]


def test_a_much_shorter_prompt_gets_its_own_pass() -> None:
    # Two rows of 40 for 65 real tokens (23% padding) group; a third row would pad 62%.
    assert prefill_groups([9, 40, 25], max_tokens=8192, slack=0.25) == [[1, 2], [0]]


def test_a_pass_is_bounded_in_tokens() -> None:
    assert prefill_groups([100] * 5, max_tokens=300, slack=0.25) == [[0, 1, 2], [3, 4]]


def test_no_slack_groups_equal_lengths_only() -> None:
    assert prefill_groups([5, 6, 5], max_tokens=8192, slack=0.0) == [[1], [0, 2]]


def test_no_prompts_no_groups() -> None:
    assert prefill_groups([], max_tokens=8192, slack=0.25) == []


def test_one_prompt_runs_as_it_is() -> None:
    cache = one_row_cache(5, seed=0)
    prefill = Prefill.build([cache], [[7, 8, 9]], DynamicCache, torch.bool, torch.device("cpu"))
    assert prefill.cache is cache
    assert prefill.inputs["input_ids"].tolist() == [[7, 8, 9]]
    assert set(prefill.inputs) == {"input_ids"}  # no padding: the model's own causal path


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_rows_are_laid_out_prefix_gap_new_and_masked(mask_dtype: torch.dtype) -> None:
    prefixes = [one_row_cache(3, seed=1), one_row_cache(1, seed=2), DynamicCache()]
    suffixes = [[11, 12], [21, 22, 23, 24], [31]]
    prefill = Prefill.build(prefixes, suffixes, DynamicCache, mask_dtype, torch.device("cpu"))
    # past = 3 columns, span = 4 new: padding ids on the left of the short suffixes.
    assert prefill.inputs["input_ids"].tolist() == [[0, 0, 11, 12], [21, 22, 23, 24], [0, 0, 0, 31]]
    positions = prefill.inputs["position_ids"]
    assert positions is not None
    assert positions.tolist() == [[3, 3, 3, 4], [1, 2, 3, 4], [0, 0, 0, 0]]
    mask = prefill.inputs["attention_mask"]
    assert mask is not None and mask.shape == (3, 1, 4, 7) and mask.dtype == mask_dtype
    seen = (mask[:, 0] if mask_dtype == torch.bool else mask[:, 0] == 0).int().tolist()
    # Row 0: prefix in columns 0-2, gap 3-4, new tokens 5-6.
    assert seen[0] == [
        [1, 1, 1, 1, 0, 0, 0],  # padding: itself, and the prefix
        [1, 1, 1, 0, 1, 0, 0],
        [1, 1, 1, 0, 0, 1, 0],  # first real token: prefix and itself, never the gap
        [1, 1, 1, 0, 0, 1, 1],
    ]
    # Row 1: left padding 0-1, prefix 2, new 3-6.
    assert seen[1][3] == [0, 0, 1, 1, 1, 1, 1]
    # Row 2: no prefix; only its last column is real.
    assert seen[2][3] == [0, 0, 0, 0, 0, 0, 1]
    # The stacked prefixes, left-padded with zeros.
    keys = prefill.cache.layers[0].keys
    assert keys is not None and keys.shape == (3, HEADS, 3, DIM)
    assert torch.equal(keys[1, :, 2], prefixes[1].layers[0].keys[0, :, 0])
    assert torch.equal(keys[1, :, :2], torch.zeros(HEADS, 2, DIM))
    assert torch.equal(keys[2], torch.zeros(HEADS, 3, DIM))


def test_settle_closes_the_gaps_for_the_batch() -> None:
    prefixes = [one_row_cache(3, seed=1), one_row_cache(1, seed=2)]
    prefill = Prefill.build(
        prefixes, [[11, 12], [21, 22, 23, 24]], DynamicCache, torch.bool, torch.device("cpu")
    )
    # What the forward pass appends: four new columns per row, rows told apart by value.
    new = torch.arange(1.0, 5.0).view(1, 1, 4, 1).expand(2, HEADS, 4, DIM) * torch.tensor(
        [1.0, -1.0]
    ).view(2, 1, 1, 1)
    for layer in range(LAYERS):
        prefill.cache.update(new.clone(), new + 100, layer)
    assert prefill.settle() == [5, 5]
    for index, layer in enumerate(prefill.cache.layers):
        keys, values = layer.keys, layer.values
        assert keys is not None and values is not None
        original = prefixes[0].layers[index].keys
        assert original is not None
        # Row 0: prefix moved up against its two new tokens, padding zeroed.
        assert torch.equal(keys[0, :, :2], torch.zeros(HEADS, 2, DIM))
        assert torch.equal(keys[0, :, 2:5], original[0])
        assert keys[0, :, 5:, 0].tolist() == [[3.0, 4.0]] * HEADS
        # Row 1 had no gap: untouched but for its left padding.
        assert keys[1, :, 3:, 0].tolist() == [[-1.0, -2.0, -3.0, -4.0]] * HEADS
        assert torch.equal(values[0, :, 2:5], original[0] + 100)
    assert prefill.row_kv(0).shape == (LAYERS, 2, HEADS, 2, DIM)
    batch: Batch[str] = Batch(torch.device("cpu"))
    batch.join(prefill.cache, [("a", 0), ("b", 0)], [5, 5])
    # Two leading columns were padding in both rows: cut off.
    assert batch.width == 5 and batch.lengths == [5, 5]


@pytest.mark.parametrize("new", [[3, 3], [2, 3]])
def test_padding_is_only_passed_where_needed(new: list[int]) -> None:
    prefixes = [one_row_cache(4, seed=1), one_row_cache(4, seed=2)]
    suffixes = [list(range(10, 10 + n)) for n in new]
    prefill = Prefill.build(prefixes, suffixes, DynamicCache, torch.bool, torch.device("cpu"))
    padded = new[0] != new[1]
    assert ("attention_mask" in prefill.inputs) is padded


# ---------------------------------------------------------------------- decode KV in place


def columns(count: int, start: float) -> torch.Tensor:
    return torch.arange(start, start + count).view(1, 1, count, 1).expand(2, HEADS, count, DIM)


def test_a_roomy_layer_appends_in_place_and_equals_a_dynamic_layer() -> None:
    cache = DynamicCache()
    cache.update(columns(3, 0.0).clone(), columns(3, 100.0).clone(), 0)
    plain_cache = DynamicCache()
    plain_cache.update(columns(3, 0.0).clone(), columns(3, 100.0).clone(), 0)
    layer = RoomyLayer.adopt(cache.layers[0])
    assert isinstance(layer, RoomyLayer)
    storages = set()
    for step in range(RoomyLayer.ROOM + 2):
        keys, values = layer.update(columns(1, 3.0 + step), columns(1, 103.0 + step))
        plain_keys, plain_values = plain_cache.layers[0].update(
            columns(1, 3.0 + step), columns(1, 103.0 + step)
        )
        assert torch.equal(keys, plain_keys) and torch.equal(values, plain_values)
        storages.add(keys.untyped_storage().data_ptr())
    # One buffer for the first ROOM + 1 steps, a second once that room was used up.
    assert len(storages) == 2


def test_a_roomy_layer_copies_what_replaced_its_keys() -> None:
    cache = DynamicCache()
    cache.update(columns(4, 0.0).clone(), columns(4, 100.0).clone(), 0)
    layer = RoomyLayer.adopt(cache.layers[0])
    layer.update(columns(1, 4.0), columns(1, 104.0))
    # What Batch does when rows leave: select rows, cut leading columns.
    assert layer.keys is not None and layer.values is not None
    layer.keys, layer.values = layer.keys[1:, :, 2:], layer.values[1:, :, 2:]
    keys, values = layer.update(columns(1, 5.0)[:1], columns(1, 105.0)[:1])
    assert keys.shape == (1, HEADS, 4, DIM)
    assert keys[0, 0, :, 0].tolist() == [2.0, 3.0, 4.0, 5.0]
    assert values[0, 0, :, 0].tolist() == [102.0, 103.0, 104.0, 105.0]


def test_only_plain_dynamic_layers_are_made_roomy() -> None:
    class Other(DynamicLayer):
        pass

    other = Other()
    assert RoomyLayer.adopt(other) is other
