"""The contract fuzzer's short run, and its saved regressions (see tests/fuzzing.py).

The long run is `python tests/fuzz_contracts.py --minutes 20`; inputs that ever broke
a property are replayed here from tests/fuzz_regressions/.
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzzing import REGRESSIONS, SEEDS, grammar_strategy, mutate, run_one

SEED_TEXTS = [p.read_text() for p in SEEDS]
SHORT = settings(
    deadline=None, database=None, suppress_health_check=list(HealthCheck), derandomize=True
)


def _holds(text: str) -> None:
    out = run_one(text)
    assert out.failure is None, f"{out.failure}\n--- input ---\n{text}"


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_seed_contracts_hold_every_property(seed):
    out = run_one(seed.read_text())
    assert out.failure is None, out.failure
    assert out.accepted
    if seed.parent.name in ("fuzz_seeds", "streaming_cache"):
        assert out.bound, "the small seeds bind to their fake model"


@settings(SHORT, max_examples=300)
@given(grammar_strategy())
def test_grammar_fuzz(text):
    _holds(text)


@settings(SHORT, max_examples=150)
@given(st.randoms(use_true_random=False), st.sampled_from(range(len(SEED_TEXTS))))
def test_mutation_fuzz(rnd: random.Random, which: int):
    _holds(mutate(SEED_TEXTS[which], rnd, SEED_TEXTS))


@pytest.mark.parametrize(
    "case", sorted(REGRESSIONS.glob("*.clock")) or [None], ids=lambda p: p.name if p else "none"
)
def test_saved_regressions(case):
    if case is None:
        pytest.skip("no saved regressions")
    _holds(case.read_text())
