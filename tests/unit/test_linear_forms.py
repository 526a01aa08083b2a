"""Linear layers' two forms of few-row products (services/engines/torch/linear_forms.py).

Which form is faster is the machine's business; these tests pin what must hold anywhere:
both forms compute the same product, a switched layer keeps its parameters and takes the
other form for exactly its row counts, and the choice follows the timings.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional

from services.engines.torch import linear_forms


class Gated(nn.Linear):
    """A subclass with a forward of its own, which tuning must leave alone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(super().forward(x))


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32, bias=False), Gated(32, 32))


@pytest.mark.parametrize("shape", [(3, 32), (2, 1, 32), (4, 5, 32), (1, 1, 32)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("padded", [0, 1, 3])
def test_both_forms_compute_the_same_product(
    shape: tuple[int, ...], bias: bool, padded: int
) -> None:
    torch.manual_seed(1)
    layer = nn.Linear(32, 48, bias=bias)
    x = torch.randn(*shape)
    rows = x.numel() // 32
    width = rows + padded if padded else 0
    out = linear_forms.transposed_linear(x, layer.weight, layer.bias, width)
    assert out.shape == (*shape[:-1], 48) and out.is_contiguous()
    torch.testing.assert_close(out, functional.linear(x, layer.weight, layer.bias))


def test_a_switched_layer_takes_the_other_form_for_its_row_counts_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = small_model()
    keys = set(model.state_dict())
    calls: list[int] = []
    real = linear_forms.transposed_linear

    def spy(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, width: int) -> torch.Tensor:
        calls.append((x.numel() // x.shape[-1], width))
        return real(x, w, b, width)

    monkeypatch.setattr(linear_forms, "transposed_linear", spy)
    plan = {(64, 32): {1: 2, 3: 3}, (32, 32): {1: 1, 2: 2, 3: 3}}
    assert linear_forms.apply(model, plan) == 1
    with torch.inference_mode():
        expected = {rows: small_model()(torch.ones(rows, 32)) for rows in (1, 2, 3)}
        for rows, out in expected.items():
            torch.testing.assert_close(model(torch.ones(rows, 32)), out)
    # The first layer at 1 row (padded to 2) and 3 rows; the subclass was not switched.
    assert calls == [(1, 2), (3, 3)]
    assert set(model.state_dict()) == keys


def test_a_switched_layer_computes_with_weights_updated_in_place() -> None:
    model = small_model()
    linear_forms.apply(model, {(64, 32): {1: 2, 2: 2, 3: 3}})
    first = model[0]
    assert isinstance(first, nn.Linear)
    with torch.no_grad():
        first.weight.mul_(-2.0)
    x = torch.randn(2, 32)
    with torch.inference_mode():
        torch.testing.assert_close(first(x), functional.linear(x, first.weight, first.bias))


def timings(faster: dict[int, float]) -> Callable[..., float]:
    """A stand-in clock: the plain form takes 1.0 at any row count, the transposed one
    ``faster[rows]`` (else 1.0)."""

    def best_s(form: object, x: torch.Tensor, weights: list[torch.Tensor]) -> float:
        if form is functional.linear:
            return 1.0
        return faster.get(x.shape[0], 1.0)

    return best_s


def test_the_other_form_is_taken_only_past_the_margin_and_padded_where_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clear, marginal = 1.0 / (linear_forms.MARGIN * 1.5), 1.0 / (linear_forms.MARGIN * 0.9)
    faster = {2: clear, 3: marginal, 5: clear, 6: clear / 2}
    monkeypatch.setattr(linear_forms, "_best_s", timings(faster))
    # 1 and 4 only by padding one row; 3 is not clear of the margin; 5 is faster padded.
    assert linear_forms.faster_widths(torch.zeros(8, 8), max_rows=6) == {
        1: 2,
        2: 2,
        4: 5,
        5: 6,
        6: 6,
    }


def test_measure_covers_each_distinct_shape_of_plain_linears_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[int, ...]] = []

    def faster_widths(
        weight: torch.Tensor, max_rows: int = linear_forms.MAX_ROWS
    ) -> dict[int, int]:
        seen.append(tuple(weight.shape))
        return {max_rows: max_rows}

    monkeypatch.setattr(linear_forms, "faster_widths", faster_widths)
    model = nn.Sequential(small_model(), nn.Linear(32, 64))  # (64, 32) a second time
    plan = linear_forms.measure(model, max_rows=3)
    assert plan == {(64, 32): {3: 3}, (32, 64): {3: 3}}
    assert sorted(seen) == [(32, 64), (64, 32)]


def test_copies_make_each_timing_read_weights_from_memory() -> None:
    small = torch.zeros(16, 16)
    big = torch.zeros(linear_forms.COLD_BYTES // 4 // 2)  # half the bytes: two copies
    assert len(linear_forms._copies(small)) == linear_forms.MAX_COPIES
    assert len(linear_forms._copies(big.view(-1, 1))) == 2


def test_only_models_with_weights_past_the_cache_are_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = small_model()
    assert not linear_forms.worth_measuring(model)  # a few KB
    plain = sum(m.weight.numel() * 4 for m in model.modules() if type(m) is nn.Linear)
    monkeypatch.setattr(linear_forms, "MIN_BYTES", plain)
    assert linear_forms.worth_measuring(model)  # the subclass's weight is not counted
    monkeypatch.setattr(linear_forms, "MIN_BYTES", plain + 1)
    assert not linear_forms.worth_measuring(model)
