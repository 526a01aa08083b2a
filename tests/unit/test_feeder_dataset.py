"""The feeder's dataset walk, pools, filter and saved state, without NATS."""

from __future__ import annotations

import random
import statistics
from collections import Counter
from pathlib import Path

import pytest

from services.domains import Domain, Problem, ValidatorSpec, load_registry
from services.domains.arithmetic import canonical, evaluate, parsed
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


class TwoWays:
    """A source without a respelling: each problem is drawn in one of two spellings."""

    def draw(self, rng: random.Random) -> Problem:
        a, b = rng.randrange(30), rng.randrange(30)
        question = f"{a} and {b}" if rng.random() < 0.5 else f"{b} and {a}"
        return Problem(key=f"pair:{min(a, b)},{max(a, b)}", question=question, metadata={})


def test_a_problem_is_asked_in_the_spellings_drawn_of_it_one_per_epoch() -> None:
    domain = Domain(name="pairs", source=TwoWays(), validators=(ValidatorSpec(kind="math"),))
    dataset = Dataset.of(domain, 400, seed=3)
    asked = asked_over(dataset, epochs=6)
    for index, problem in enumerate(dataset.problems):
        spellings = {p.question for p in dataset.spellings[index]}
        assert {p.key for p in dataset.spellings[index]} == {problem.key}
        assert asked[problem.key] <= spellings
    several = [p.key for i, p in enumerate(dataset.problems) if len(dataset.spellings[i]) > 1]
    assert len(several) > 20
    assert sum(len(asked[k]) > 1 for k in several) > 0.8 * len(several)
    # The spelling is a function of the visit's place: a second walk asks the same.
    twice = [walk_questions(dataset, DomainState(), 3 * len(dataset.problems)) for _ in "ab"]
    assert twice[0] == twice[1]


def test_an_arithmetic_problem_is_written_another_way_each_epoch() -> None:
    domain = load_registry(None, plugins=False).get("arithmetic_sum4")
    dataset = Dataset.of(domain, 400, seed=3)
    asked = asked_over(dataset, epochs=6)
    for problem in dataset.problems:
        for question in asked[problem.key]:
            operands, operators = parsed(question)
            assert f"arith:{canonical(operands, operators)}" == problem.key
            assert str(evaluate(operands, operators)) == problem.metadata["answer"]
    distinct = [len(asked[p.key]) for p in dataset.problems if len(set(p.question) - {"+"}) == 4]
    assert statistics.fmean(distinct) > 4  # six epochs, four distinct digits


def asked_over(dataset: Dataset, epochs: int) -> dict[str, set[str]]:
    asked: dict[str, set[str]] = {}
    state = DomainState()
    for key, question in walk_questions(dataset, state, epochs * len(dataset.problems)):
        asked.setdefault(key, set()).add(question)
    return asked


def walk_questions(dataset: Dataset, state: DomainState, visits: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(visits):
        visit = dataset.next(state, SETTINGS)
        moved(state, visit)
        assert visit.problem is not None
        out.append((visit.problem.key, visit.problem.question))
    return out


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
