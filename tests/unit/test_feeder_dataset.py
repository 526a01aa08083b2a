"""The feeder's dataset walk, pools, filter and saved state, without NATS."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from services.domains import load_registry
from services.feeder.dataset import Dataset, moved, pool_of, pool_sizes
from services.feeder.mix import MixError, parse_mix
from services.feeder.settings import FeederSettings
from services.feeder.state import Cursor, DomainState, FeederState, OpenTask, StateStore

SETTINGS = FeederSettings(mix=("arithmetic_sum4",), dataset_size=60, seed=3)


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    domain = load_registry(None, plugins=False).get("arithmetic_sum4")
    return Dataset.of(domain, SETTINGS.dataset_size, SETTINGS.seed)


def walk(dataset: Dataset, state: DomainState, settings: FeederSettings, visits: int) -> list[str]:
    """Keys taken over ``visits`` calls, moving the cursor as the service does."""
    taken = []
    for _ in range(visits):
        visit = dataset.next(state, settings)
        moved(state, visit)
        if visit.problem is not None:
            taken.append(visit.problem.key)
    return taken


def test_the_dataset_holds_distinct_training_problems(dataset: Dataset) -> None:
    keys = [p.key for p in dataset.problems]
    assert len(keys) == len(set(keys)) > 20
    assert all(dataset.domain.split_of(p) == "train" for p in dataset.problems)


def test_each_epoch_visits_every_problem_once_in_its_own_order(dataset: Dataset) -> None:
    size = len(dataset.problems)
    state = DomainState()
    first, second = walk(dataset, state, SETTINGS, size), walk(dataset, state, SETTINGS, size)
    assert sorted(first) == sorted(second) == sorted(p.key for p in dataset.problems)
    assert first != second
    assert state.cursor == Cursor(epoch=2, index=0)


def test_a_walk_resumed_from_a_saved_cursor_continues_where_it_stopped(
    dataset: Dataset, tmp_path: Path
) -> None:
    whole = walk(dataset, DomainState(), SETTINGS, 25)
    state = DomainState()
    head = walk(dataset, state, SETTINGS, 10)
    store = StateStore(tmp_path)
    store.save(FeederState(domains={"d": state}))
    tail = walk(dataset, store.load().domains["d"], SETTINGS, 15)
    assert head + tail == whole


def test_pools_follow_the_last_pass_rate() -> None:
    assert pool_of(None, SETTINGS) == "normal"
    assert pool_of(1.0, SETTINGS) == "easy"
    assert pool_of(0.0, SETTINGS) == "hard"
    assert pool_of(0.5, SETTINGS) == "normal"
    strict = FeederSettings(easy_at=0.75, hard_at=0.25)
    assert (pool_of(0.75, strict), pool_of(0.25, strict)) == ("easy", "hard")


def test_the_cursor_favours_the_normal_pool(dataset: Dataset) -> None:
    keys = [p.key for p in dataset.problems]
    easy, normal = set(keys[: len(keys) // 2]), set(keys[len(keys) // 2 :])
    state = DomainState(pass_rate=dict.fromkeys(easy, 1.0))
    assert pool_sizes(dataset, state, SETTINGS) == {
        "easy": len(easy),
        "normal": len(normal),
        "hard": 0,
    }
    taken: Counter[str] = Counter()
    while state.cursor.epoch < 8:
        taken.update(walk(dataset, state, SETTINGS, 1))
    from_easy = sum(taken[k] for k in easy) / (8 * len(easy))
    assert all(taken[k] == 8 for k in normal)
    assert 0.1 < from_easy < 0.4  # easy_take is 0.25
    # Every visit of an easy problem took it or passed over it (the last call may have
    # passed over a few of the next epoch before it took one).
    visits = state.passed_over["easy"] + sum(taken[k] for k in easy)
    assert 8 * len(easy) <= visits < 9 * len(easy)


def test_skipped_problems_never_come_back_and_later_ones_miss_an_epoch(dataset: Dataset) -> None:
    keys = [p.key for p in dataset.problems]
    size = len(keys)
    state = DomainState(skipped=[keys[0]], later={keys[1]: 1})
    first, second = walk(dataset, state, SETTINGS, size), walk(dataset, state, SETTINGS, size)
    assert keys[0] not in first + second
    assert keys[1] not in first and keys[1] in second
    assert state.passed_over == {"skipped": 2, "later": 1}


def test_a_dataset_with_nothing_left_to_take_says_so(dataset: Dataset) -> None:
    state = DomainState(skipped=[p.key for p in dataset.problems])
    visit = dataset.next(state, SETTINGS)
    assert visit.problem is None
    assert visit.passed_over == {"skipped": len(dataset.problems)}


def test_state_round_trips_and_a_bad_file_is_named(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    assert store.load().open == {}
    state = FeederState(open={"t": OpenTask(domain="d", key="k", group=4, sent_at=1.0)})
    state.domain("d").pass_rate["k"] = 0.5
    store.save(state)
    assert store.load() == state
    store.path.write_text("{not json")
    with pytest.raises(ValueError, match=r"feeder\.json"):
        store.load()


def test_mix_entries_parse_and_bad_ones_are_named() -> None:
    assert parse_mix(("a=2", "b", " c = 0.5")) == {"a": 2.0, "b": 1.0, "c": 0.5}
    for bad, reason in (("=2", "names no domain"), ("a=x", "not a number"), ("a=0", "positive")):
        with pytest.raises(MixError, match=reason):
            parse_mix((bad,))
    with pytest.raises(MixError, match="twice"):
        parse_mix(("a", "a=2"))
