"""The validator's batch path: results embed the rollout's own bytes; tolerance checked exactly;
the collector tuned for rollouts in flight."""

from __future__ import annotations

import gc
from fractions import Fraction

import msgpack
import msgspec
from hypothesis import given
from hypothesis import strategies as st

from protocol.codec import Codec, encode
from protocol.messages import (
    ChatMessage,
    Rollout,
    ScoredRollout,
    ScoreStatus,
    Task,
    ValidatorDetail,
    rollout_id,
)
from protocol.packed import pack_f32, pack_i32
from services.validator.numbers import close
from services.validator.service import ScoredWire, tune_gc

SCORED: Codec[ScoredRollout] = Codec(ScoredRollout)


def rollout() -> Rollout:
    task = Task(
        id="t-1",
        domain="arithmetic",
        prompt=[ChatMessage(role="user", content="3+4=")],
        metadata={"answer": "7"},
    )
    return Rollout(
        id=rollout_id(task.id, 0),
        task=task,
        sample_index=0,
        tokens=pack_i32(range(6)),
        prompt_len=4,
        logprobs=pack_f32([-0.5, -0.25]),
        loss_mask=b"\x01\x01",
        completion_text="<answer>7</answer>",
    )


def scored_pair(original: bytes, decoded: Rollout) -> tuple[ScoredWire, ScoredRollout]:
    fields = {
        "id": decoded.id,
        "reward": 1.0,
        "status": ScoreStatus.SCORED,
        "details": [ValidatorDetail(name="math", score=1.0)],
        "error": None,
        "validator": "validator/a",
        "scored_at": 1.5,
    }
    return ScoredWire(rollout=msgspec.Raw(original), **fields), ScoredRollout(
        rollout=decoded, **fields
    )


def test_the_wire_form_is_byte_for_byte_a_scored_rollout() -> None:
    original = encode(rollout())
    wire, scored = scored_pair(original, rollout())
    assert msgspec.msgpack.encode(wire) == encode(scored)
    assert SCORED.decode(msgspec.msgpack.encode(wire)) == scored


def test_a_rollout_from_another_encoder_is_kept_as_it_came() -> None:
    # A plain msgpack client may order keys differently and add fields this reader lacks.
    fields = msgpack.unpackb(encode(rollout()))
    fields = {"future_field": [1, 2], **dict(reversed(list(fields.items())))}
    original = msgpack.packb(fields)
    wire, scored = scored_pair(original, Codec(Rollout).decode(original))
    stored = msgspec.msgpack.encode(wire)
    assert SCORED.decode(stored) == scored
    assert msgpack.unpackb(stored)["rollout"]["future_field"] == [1, 2]


FRACTIONS = st.fractions(max_denominator=10**6).filter(lambda f: abs(f) < 10**12)
TOLERANCES = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False) | st.sampled_from(
    [0.0, 1e-9, 1e-6, 0.005, 0.01, 5e-324]
)


@given(FRACTIONS, FRACTIONS, TOLERANCES, TOLERANCES)
def test_close_in_integers_agrees_with_fraction_arithmetic(
    a: Fraction, b: Fraction, rel_tol: float, abs_tol: float
) -> None:
    bound = max(Fraction(abs_tol), Fraction(rel_tol) * max(abs(a), abs(b)))
    assert close(a, b, rel_tol, abs_tol) == (a == b or abs(a - b) <= bound)


@given(FRACTIONS, st.integers(min_value=1, max_value=10**6), TOLERANCES)
def test_close_near_the_bound(a: Fraction, scale: int, rel_tol: float) -> None:
    b = a + Fraction(abs(rel_tol)) * abs(a) * Fraction(scale, 10**6) * 2
    bound = max(Fraction(0), Fraction(rel_tol) * max(abs(a), abs(b)))
    assert close(a, b, rel_tol, 0.0) == (abs(a - b) <= bound)


def test_gc_tuning_raises_the_young_threshold_and_respects_a_switched_off_collector() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        frozen = gc.get_freeze_count()
        tune_gc(0)  # the setting's "leave it alone"
        assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == frozen
        tune_gc(50_000)
        assert gc.get_threshold() == (50_000, 10, 10)
        assert gc.get_freeze_count() > 0  # what was loaded is left out of collections
        gc.set_threshold(0, 10, 10)
        tune_gc(50_000)
        assert gc.get_threshold() == (0, 10, 10)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
