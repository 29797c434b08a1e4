"""What a reward by import path may return: whatever TRL's GRPOTrainer takes scores the same here, and what it
refuses is refused (`invalid`, one line).

TRL (`_calculate_rewards` in trl/trainer/grpo_trainer.py) iterates the function's result, maps None to NaN and
stores `torch.tensor(result, dtype=float32)` as one column of the batch's rewards. The expectations below were
measured with that conversion (torch 2.13 from the engine env, numpy 2.5): accepted kinds give these values
(NaN shown as None: left out of the sum, as TRL's nansum leaves it), refused kinds raise there. A few results TRL
lets through by accident are refused here on purpose (rewards/worker.py `check_values` lists them).
Each case runs in a real worker of one pool.
"""

from __future__ import annotations

import math
import sys

import pytest

from rewards.config import RewardPoolConfig
from rewards.pool import Call, RewardPool

MODULE = '''
import array, asyncio, decimal, fractions
import numpy as np
import pandas as pd

VALUES = {
    "list": lambda: [0.5, 1],
    "tuple": lambda: (0.5, 1),
    "generator": lambda: (x for x in (0.5, 1.0)),
    "range": lambda: range(2),
    "array.array": lambda: array.array("d", [0.5, 1.0]),
    "numpy float64": lambda: np.array([0.5, 1.0]),
    "numpy float32": lambda: np.array([0.25, 1.0], dtype=np.float32),
    "numpy int": lambda: np.array([1, 2]),
    "numpy bool": lambda: np.array([True, False]),
    "numpy object with None": lambda: np.array([0.5, None], dtype=object),
    "numpy with NaN": lambda: np.array([np.nan, 1.0]),
    "numpy scalars": lambda: [np.float64(0.5), np.int64(1)],
    "numpy float16 and bool scalars": lambda: [np.float16(0.5), np.bool_(True)],
    "pandas Series": lambda: pd.Series([0.5, None]),
    "bools": lambda: [True, False],
    "None and NaN": lambda: [None, float("nan")],
    "Fraction and Decimal": lambda: [fractions.Fraction(1, 4), decimal.Decimal("0.5")],
    "Decimal NaN": lambda: [decimal.Decimal("NaN"), 1],
    # refused by TRL as well
    "a float": lambda: 0.5,
    "None": lambda: None,
    "a string": lambda: "ab",
    "strings": lambda: ["0.5", "1"],
    "complex": lambda: [1 + 0j, 1],
    "nested lists": lambda: [[0.5], [1.0]],
    "numpy column": lambda: np.array([[0.5], [1.0]]),
    "numpy 0-d": lambda: np.array(0.5),
    "0-d arrays in a list": lambda: [np.array(0.5), np.array(1.0)],
    "too many": lambda: [0.5, 1, 2],
    "an int past float": lambda: [10**400, 1],
    # let through by TRL by accident, refused here
    "dict": lambda: {0.5: "a", 1.0: "b"},
    "set": lambda: {0.5, 1.0},
    "bytes": lambda: b"ab",
    "one value": lambda: [0.5],
    "numpy row": lambda: np.array([[0.5, 1.0]]),
    "infinity": lambda: [float("inf"), 1.0],
}

def give(prompts, completions, kind, **kwargs):
    return VALUES[kind]()

async def give_async(prompts, completions, kind, **kwargs):
    await asyncio.sleep(0)
    return VALUES[kind]()
'''

ACCEPTED = {
    "list": [0.5, 1.0], "tuple": [0.5, 1.0], "generator": [0.5, 1.0], "range": [0.0, 1.0],
    "array.array": [0.5, 1.0], "numpy float64": [0.5, 1.0], "numpy float32": [0.25, 1.0], "numpy int": [1.0, 2.0],
    "numpy bool": [1.0, 0.0], "numpy object with None": [0.5, None], "numpy with NaN": [None, 1.0],
    "numpy scalars": [0.5, 1.0], "numpy float16 and bool scalars": [0.5, 1.0], "pandas Series": [0.5, None],
    "bools": [1.0, 0.0], "None and NaN": [None, None], "Fraction and Decimal": [0.25, 0.5], "Decimal NaN": [None, 1.0],
}
REFUSED = {
    "a float": "returned float, not one number (or None) per completion (2)",
    "None": "returned NoneType, not one number",
    "a string": "returned str, not one number",
    "strings": "value 0 is str '0.5': not a number or None",
    "complex": "value 0 is complex '(1+0j)': not a number or None",
    "nested lists": "value 0 is list '[0.5]': not a number or None",
    "numpy column": "returned a 2-dimensional ndarray, not a flat sequence of 2 numbers",
    "numpy 0-d": "returned a 0-dimensional ndarray",
    "0-d arrays in a list": "value 0 is ndarray '0.5': a numpy array, not a number or None (return value.item())",
    "too many": "returned 3 values for 2 completions",
    "an int past float": "int too large to convert to float",
    "dict": "returned dict, not one number",
    "set": "returned set, not one number",
    "bytes": "returned bytes, not one number",
    "one value": "returned 1 values for 2 completions",
    "numpy row": "returned a 2-dimensional ndarray",
    "infinity": "value 0 is float 'inf': an infinity",
}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """One pool for every case, its functions in a module on the driver's sys.path (as PYTHONPATH puts it)."""
    folder = tmp_path_factory.mktemp("returns")
    folder.chmod(0o755)  # as root the workers run as nobody, who must read the module's folder
    (folder / "reward_returns.py").write_text(MODULE)
    sys.path.insert(0, str(folder))
    try:
        with RewardPool({0: "reward_returns:give", 1: "reward_returns:give_async"}, {0: "give", 1: "give_async"},
                        RewardPoolConfig(workers=1)) as pool:
            yield pool
    finally:
        sys.path.remove(str(folder))


def score(pool: RewardPool, kind: str, fn: int = 0):
    return pool.run([Call(fn, {"prompts": ["p", "p"], "completions": ["a", "b"], "kind": kind})])[0]


@pytest.mark.parametrize("kind", ACCEPTED)
def test_what_trl_takes_scores_as_trl_scores_it(pool, kind) -> None:
    """Fails on main at 85b20f9 for numpy arrays of every dtype, generators, range, array.array, a pandas Series
    (`invalid`: "returned ndarray, not a list of 2 floats"), numpy bool scalars and Decimals ("not a number");
    lists and tuples of floats, bools, None/NaN, numpy float/int scalars and Fractions passed there too."""
    outcome = score(pool, kind)
    assert outcome.kind is None, f"{kind}: refused ({outcome.message}) where TRL takes it"
    assert outcome.values == ACCEPTED[kind], f"{kind}: scored {outcome.values}, TRL {ACCEPTED[kind]}"


@pytest.mark.parametrize("kind", REFUSED)
def test_what_trl_refuses_or_takes_by_accident_is_refused_in_one_line(pool, kind) -> None:
    outcome = score(pool, kind)
    assert outcome.kind == "invalid" and outcome.values is None, f"{kind}: scored {outcome.values}"
    assert REFUSED[kind] in outcome.message and "\n" not in outcome.message, outcome.message


def test_an_async_reward_returning_a_numpy_array_scores(pool) -> None:
    outcome = score(pool, "numpy with NaN", fn=1)
    assert outcome.kind is None and outcome.values[1] == 1.0 and outcome.values[0] is None


def test_every_accepted_value_is_finite_or_none(pool) -> None:
    """The pool hands the reward set floats or None only (NaN and None are both None): nothing downstream sees NaN."""
    for kind in ACCEPTED:
        assert all(v is None or math.isfinite(v) for v in score(pool, kind).values), kind
