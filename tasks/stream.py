"""PromptStream: endless seeded batches over the train prompts, resumable exactly from its state_dict."""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence

from tasks.prompt import Prompt


class PromptStream:
    """Endless seeded batches over prompts, reshuffled each epoch; `state_dict` resumes it exactly.

    Batches are always full: the last batch of an epoch continues into the next epoch's order. The state is just
    (epoch, position) because each epoch's order is recomputed from (seed, epoch). `prompts` may be lazy (a data
    file's RowPrompts): only the drawn ones are read, and the order is an array of 8-byte positions.
    """

    def __init__(self, prompts: Sequence[Prompt], batch_size: int, seed: int):
        if not len(prompts):
            raise ValueError("PromptStream needs at least one prompt; check data.train_size and the dataset")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._prompts, self.batch_size, self.seed = prompts, batch_size, seed
        self._source = getattr(prompts, "fingerprint", None)  # a data file's size and rows; None for generators
        self._set(epoch=0, position=0)

    @property
    def epoch(self) -> int:
        return self._epoch

    def next_batch(self, count: int | None = None) -> list[Prompt]:
        """The next `count` prompts (default batch_size); a dynamic-sampling refill draws fewer or more."""
        size = self.batch_size if count is None else count
        if size < 1:
            raise ValueError(f"next_batch count must be >= 1, got {count}")
        batch: list[Prompt] = []
        while len(batch) < size:
            if self._position == len(self._order):
                self._set(self._epoch + 1, 0)
            take = min(size - len(batch), len(self._order) - self._position)
            batch.extend(self._prompts[i] for i in self._order[self._position : self._position + take])
            self._position += take
        return batch

    def state_dict(self) -> dict:
        state = {"epoch": self._epoch, "position": self._position, "num_prompts": len(self._prompts),
                 "seed": self.seed}
        if self._source is not None:
            state["source"] = self._source
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_prompts") != len(self._prompts) or state.get("seed") != self.seed:
            raise ValueError(
                f"stream state is for {state.get('num_prompts')} prompts with seed {state.get('seed')}, this one has "
                f"{len(self._prompts)} with seed {self.seed}; resume with the run's saved data config"
            )
        if state.get("source") != self._source:
            raise ValueError(f"stream state is for data {state.get('source')}, this one reads {self._source}: the "
                             "data file changed since the checkpoint; resume with the file the run trained on")
        if not 0 <= state["position"] <= len(self._prompts):
            raise ValueError(f"stream state position {state['position']} outside 0..{len(self._prompts)}")
        self._set(int(state["epoch"]), int(state["position"]))

    def _set(self, epoch: int, position: int) -> None:
        self._epoch, self._position = epoch, position
        # An array shuffles to exactly the order a list would (random.shuffle only swaps items), at 8 bytes an item.
        self._order = array("q", range(len(self._prompts)))
        random.Random(f"stream-{self.seed}-{epoch}").shuffle(self._order)
