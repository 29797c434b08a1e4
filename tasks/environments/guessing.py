"""The guessing game: the environment holds a secret integer; each model turn guesses, the reply says "higher" or
"lower", and a right guess ends the episode with reward 1.

The rows are the environment's own: (secret, upper bound) pairs drawn from `data.seed`, split into train and eval
by a hash of the pair, as the other tasks are, so held-out games never appear in training. A turn without a number
is answered with the rules again (it costs a turn). Binary search finds any secret of 1..high within
ceil(log2(high + 1)) guesses, so `environment.max_turns` at that count makes every game winnable.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from pydantic import model_validator

from common.strict import Strict
from tasks.config import DataConfig
from tasks.dataset import DatasetTooSmall, Prompt, is_eval
from tasks.environments.base import Message, ModelTurn, Reply

SYSTEM = "You are playing a guessing game. Reply with one number only: your guess."
USER = "I am thinking of an integer from 1 to {high}. Guess it. After each guess I will say higher or lower."
RULES = "Reply with one number from 1 to {high}."
_NUMBER = re.compile(r"-?[0-9]{1,12}")


class GuessingGame(Strict):
    """The environment (its fields are `environment.params`)."""

    highs: tuple[int, int] = (8, 64)
    """Smallest and largest upper bound of a game: every (secret, high) with high in this range and secret in
    1..high is a game (8..64: 2052 games, about 200 of them held out)."""

    @model_validator(mode="after")
    def _check(self) -> GuessingGame:
        if not 2 <= self.highs[0] <= self.highs[1]:
            raise ValueError(f"highs {list(self.highs)}: give [smallest, largest] upper bound, 2 <= smallest <= largest")
        return self

    def rows(self, data: DataConfig, split: str) -> list[Prompt]:
        """`data.train_size` / `data.eval_size` distinct games of the split, drawn from `data.seed`."""
        size = data.train_size if split == "train" else data.eval_size
        games = [(secret, high) for high in range(self.highs[0], self.highs[1] + 1) for secret in range(1, high + 1)
                 if is_eval(repr(("guess", secret, high))) == (split == "eval")]
        if size > len(games):
            raise DatasetTooSmall(f"data.{split}_size={size}, but the guessing game with highs {list(self.highs)} has "
                                  f"{len(games)} {split} games; lower it or add larger highs (environment.params)")
        random.Random(f"guess-{data.seed}-{split}").shuffle(games)
        return [Prompt(f"guess-{split}-{i:06d}", "guess", None, None, {"secret": secret, "high": high})
                for i, (secret, high) in enumerate(games[:size])]

    def episode(self, row: Prompt) -> GuessEpisode:
        return GuessEpisode(int(row.reference["secret"]), int(row.reference["high"]))


@dataclass
class GuessEpisode:
    secret: int
    high: int

    def opening(self) -> list[Message]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER.format(high=self.high)}]

    def step(self, turn: ModelTurn) -> Reply:
        match = _NUMBER.search(turn.text)
        if match is None:
            return Reply([{"role": "user", "content": RULES.format(high=self.high)}], info={"invalid_guesses": 1})
        guess = int(match.group())
        if guess == self.secret:
            return Reply(reward=1.0, done=True, info={"guesses": 1})
        hint = "Higher." if guess < self.secret else "Lower."
        return Reply([{"role": "user", "content": hint}], info={"guesses": 1})

