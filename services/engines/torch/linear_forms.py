"""Few-row products of decoding: per weight shape, the faster of two equal forms, measured.

A decode step multiplies a few rows (one per sequence in the batch) by every weight
matrix.  ``F.linear`` computes ``x @ W.T``; the same product taken as ``(W @ x.T).T``
sends the BLAS down another kernel.  Which one is faster for few rows depends on the CPU
and the BLAS: on this project's 2-core AMD EPYC machine with torch's MKL, the second
reads the weights about 2x faster at 2-4 rows and is slower from 5-8 rows on, which
makes a four-row decode step of ``bench/bench_generator.py``'s model about a quarter
shorter; and one row (MKL's matrix-vector kernel) goes faster as two, a zero row padded
on.  So the torch engine measures the forms once per weight shape and row count when it
loads a model, and a layer takes the second form (over its rows, or one more) only for
the row counts where it clearly won.
Results agree to float rounding (another summation order), not bit for bit.

The layers stay ``nn.Linear`` with their own parameters (state dict and in-place weight
updates unchanged); only their ``forward`` is replaced.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.nn import functional

#: The other form must be at least this much faster to be used.
MARGIN = 1.2
#: Row counts measured (1..MAX_ROWS); more rows always take ``F.linear``.
MAX_ROWS = 8
REPEATS = 3
#: Each timing cycles through copies of the weight of about this many bytes in all, so
#: that it comes from memory, as in a forward pass (a single copy may sit in the cache).
COLD_BYTES = 64 << 20
MAX_COPIES = 16
#: Smaller models are not measured: their weights stay in the CPU's caches and their
#: decode steps are bound by the per-layer overhead, not by the products.
MIN_BYTES = 16 << 20

Shape = tuple[int, int]
Form = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
#: Per weight shape (out, in): row count -> the rows the transposed form computes, the
#: same or one more (a zero row padded on, where that is faster still: one row is at MKL's
#: matrix-vector kernel, two at its matrix-matrix one).
Widths = Mapping[int, int]
Plan = Mapping[Shape, Widths]


def transposed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, width: int = 0
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x.T).T``, over ``width`` rows
    (zero rows padded on) when that is more than ``x`` has."""
    rows = x.reshape(-1, x.shape[-1])
    count = rows.shape[0]
    if width > count:
        rows = torch.cat((rows, rows.new_zeros(width - count, rows.shape[1])))
    out = torch.mm(weight, rows.t()).t()[:count].contiguous()
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def faster_widths(weight: torch.Tensor, max_rows: int = MAX_ROWS) -> dict[int, int]:
    """For the row counts (1..max_rows) where the transposed form, over those rows or one
    more, beat ``F.linear``: the rows it computes."""
    with torch.inference_mode():
        copies = _copies(weight)
        inputs = {
            rows: torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
            for rows in range(1, max_rows + 2)
        }
        other = {rows: _best_s(transposed_linear, inputs[rows], copies) for rows in inputs}
        widths = {}
        for rows in range(1, max_rows + 1):
            width = min((rows, rows + 1), key=other.__getitem__)
            if _best_s(functional.linear, inputs[rows], copies) > MARGIN * other[width]:
                widths[rows] = width
    return widths


def _copies(weight: torch.Tensor) -> list[torch.Tensor]:
    size = weight.numel() * weight.element_size()
    count = min(MAX_COPIES, max(1, COLD_BYTES // max(size, 1)))
    return [weight.detach().clone() for _ in range(count)]


def worth_measuring(model: nn.Module) -> bool:
    """Whether the model's linear weights are large enough for the form to matter."""
    size = sum(layer.weight.numel() * layer.weight.element_size() for layer in _linears(model))
    return size >= MIN_BYTES


def measure(model: nn.Module, max_rows: int = MAX_ROWS) -> dict[Shape, dict[int, int]]:
    """The plan: both forms timed once per distinct weight shape of the model's linear
    layers; the shapes where the transposed form won at some row count."""
    measured: dict[Shape, dict[int, int]] = {}
    for layer in _linears(model):
        shape = _shape(layer)
        if shape not in measured:
            measured[shape] = faster_widths(layer.weight, max_rows)
    return {shape: widths for shape, widths in measured.items() if widths}


def apply(model: nn.Module, plan: Plan) -> int:
    """Switch each linear layer whose shape has row counts in ``plan``; how many were."""
    switched = 0
    for layer in _linears(model):
        widths = plan.get(_shape(layer))
        if widths:
            # An instance attribute: nn.Module.__call__ looks ``forward`` up on the instance.
            object.__setattr__(layer, "forward", types.MethodType(_forward_for(widths), layer))
            switched += 1
    return switched


def _forward_for(widths: Widths) -> Callable[[nn.Linear, torch.Tensor], torch.Tensor]:
    def forward(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        width = widths.get(x.numel() // layer.in_features)
        if width is not None:
            return transposed_linear(x, layer.weight, layer.bias, width)
        return functional.linear(x, layer.weight, layer.bias)

    return forward


def _linears(model: nn.Module) -> list[nn.Linear]:
    # Exactly nn.Linear: a subclass may compute something else in its forward.
    return [m for m in model.modules() if type(m) is nn.Linear]


def _shape(layer: nn.Linear) -> Shape:
    return (layer.out_features, layer.in_features)


def _best_s(form: Form, x: torch.Tensor, weights: list[torch.Tensor]) -> float:
    """The best of REPEATS passes of ``form`` over ``weights`` (after one warm-up pass)."""
    best = float("inf")
    for attempt in range(REPEATS + 1):
        start = time.perf_counter()
        for weight in weights:
            form(x, weight, None)
        if attempt:  # the first pass: first-call allocations and kernel selection
            best = min(best, time.perf_counter() - start)
    return best
