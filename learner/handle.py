"""`LearnerHandle`: the learner as the driver sees it, with plain methods and one error of its own.

The primitives are the Tinker API's, so the GRPO loop and a training service drive the same learner code:
`forward_backward(batch, loss)` adds a loss's gradient, `forward` computes it without one, `optim_step()` applies
it, `save_for_sampler()` gives the `LoraAdapter` the engines serve next, `save_state` / `load_state` keep a service's
adapter; `save` / `restore` / `export` keep and hand out the run's LoRA. Each is the Learner method of the same
name, run in the actor by its one generic `call` (learner/actor.py). Behind the handle is one
LearnerActor or, with `learner.hosts > 1`, a group of them (learner/group.py); the caller cannot tell. Calls that
take long (an update, a save) return a `Pending` at once, so the loop can generate while the learner works; actor
calls run in the order they were made, so an optim_step submitted after a forward_backward applies its gradient.

A dead learner process (or a lost member of a group) becomes one `LearnerDied` line naming what it was doing,
as the rollout handle turns a dead engine into a restart: nothing above this module imports Ray for the learner.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import ray

from common.lora_adapter import LoraAdapter
from learner.adapter_api import POLICY, AdamParams
from learner.config import LearnerConfig, LoraConfig
from learner.group import LearnerGroup, LearnerProcessLost, start_learner

T = TypeVar("T")


class LearnerDied(RuntimeError):
    """The learner is gone: nothing more can be learned or saved by this handle (resume from the checkpoint)."""


class Pending(Generic[T]):
    """A learner call in flight: `result()` waits for it (a dead learner raises `LearnerDied`)."""

    def __init__(self, ref: Any, what: str, then: Callable[[Any], T] | None = None):
        self._ref, self.what, self._then = ref, what, then

    def result(self) -> T:
        value = learner_get(self._ref, self.what)
        return self._then(value) if self._then is not None else value


def learner_get(ref: Any, what: str) -> Any:
    """ray.get of a learner call; a dead learner actor becomes one `LearnerDied` line instead of Ray's report."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as exc:
        cause = str(exc).strip().splitlines()[0][:200]
        raise LearnerDied(f"the learner actor died during {what} ({cause})") from None
    except LearnerProcessLost as exc:  # learner.hosts > 1: Ray re-raises the group's error as this type
        cause = str(getattr(exc, "cause", None) or exc).strip().splitlines()[-1]
        raise LearnerDied(f"a learner process died during {what} ({cause})") from None
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, ValueError):  # the learner refused the call's input: its one line, not Ray's trace
            raise ValueError(str(exc.cause)) from None
        raise


class LearnerHandle:
    """Plain methods over the learner's actor (or group of actors)."""

    def __init__(self, actor: Any):
        self._actor = actor

    @classmethod
    def start(cls, cfg: LearnerConfig, model_path: Path, checkpoint_dir: str | None = None,
              actor_options: dict[str, Any] | None = None, placement: Any = None,
              process_env: list[dict[str, str]] | None = None) -> LearnerHandle:
        """Start the learner's process(es) (see learner/group.py `start_learner`); returns at once, the model
        loads in the background and the first call waits for it."""
        return cls(start_learner(cfg, model_path, checkpoint_dir, actor_options, placement, process_env))

    @property
    def actors(self) -> list:
        """The Ray actors behind the handle (for fault tests and placement reports)."""
        return list(self._actor.actors) if isinstance(self._actor, LearnerGroup) else [self._actor]

    def _call(self, name: str, *args: Any, what: str) -> Pending[Any]:
        """Learner primitive `name` (learner/learner.py) in flight; `Pending` arguments go as their results."""
        args = tuple(a._ref if isinstance(a, Pending) else a for a in args)
        return Pending(self._actor.call.remote(name, *args), what)

    # ---- the update primitives (`adapter`: which LoRA; the learner's own, POLICY, unless a service added more) --
    def forward_backward(self, batch: Any, loss: str = "grpo", adapter: str = POLICY,
                         config: dict[str, float] | None = None,
                         old: Pending[dict] | dict | None = None) -> Pending[dict[str, Any]]:
        """Add the gradient of `loss` on `batch` (learner/learner.py); its metrics (and, for a token loss, the
        datums' logprobs) when done. `old`: a "grpo" step's pre-update logprobs, `forward`'s answer (a Pending one
        is fine: the learner waits for it, the caller does not)."""
        return self._call("forward_backward", batch, loss, adapter, config, old, what=f"the forward_backward ({loss})")

    def forward(self, batch: Any, loss: str = "grpo", adapter: str = POLICY,
                config: dict[str, float] | None = None) -> Pending[dict[str, Any]]:
        """forward_backward without the gradient: the loss and the datums' logprobs."""
        return self._call("forward", batch, loss, adapter, config, what=f"the forward ({loss})")

    def optim_step(self, adapter: str = POLICY, adam: AdamParams | None = None) -> Pending[dict[str, float]]:
        """Apply the gradient held for `adapter` (after every forward_backward submitted before it)."""
        return self._call("optim_step", adapter, adam, what="the optimizer step")

    def save_for_sampler(self, adapter: str = POLICY, name: str | None = None) -> LoraAdapter:
        """The LoRA as a `LoraAdapter` named `name` (default: the adapter's own): what the engines serve next."""
        return self._call("save_for_sampler", adapter, name, what="the LoRA export").result()

    # ---- adapters a training service adds ---------------------------------------------------------------
    def add_adapter(self, name: str, lora: LoraConfig, seed: int = 0) -> Pending[None]:
        return self._call("add_adapter", name, lora, seed, what=f"adding adapter {name}")

    def drop_adapter(self, name: str) -> Pending[None]:
        return self._call("drop_adapter", name, what=f"dropping adapter {name}")

    def save_state(self, name: str, directory: str) -> Pending[None]:
        """Adapter `name`'s weights and optimizer state as a checkpoint in `directory`."""
        return self._call("save_state", name, directory, what=f"saving adapter {name}")

    def load_state(self, name: str, directory: str, optimizer: bool = True) -> Pending[LoraConfig]:
        """Adapter `name` from a `save_state` checkpoint (with its Adam moments unless `optimizer` is False)."""
        return self._call("load_state", name, directory, optimizer, what=f"loading adapter {name}")

    # ---- checkpoints and export ---------------------------------------------------------------------------
    def save(self, step: int, extra: dict | None = None) -> Pending[None]:
        """Checkpoint the LoRA, optimizer state and RNG with `step` and `extra` (JSON-able)."""
        return self._call("save", step, extra, what=f"the checkpoint of step {step}")

    def restore(self) -> tuple[int, dict]:
        """The latest checkpoint restored: (step, extra), (0, {}) when there is none."""
        return self._call("restore", what="the checkpoint restore").result()

    def export(self, out_dir: str | Path, adapter: str = POLICY) -> str:
        """The LoRA as a PEFT folder at `out_dir` (a local path or a storage URI); returns where it went."""
        return self._call("export", str(out_dir), adapter, what="the adapter export").result()

    def node(self) -> str:
        """Where process 0 runs: "IP (hostname)"."""
        return learner_get(self._actor.node.remote(), "start")

    def devices(self) -> list[str]:
        return learner_get(self._actor.devices.remote(), "start")

    def kill(self) -> None:
        """Stop every learner process; idempotent."""
        if isinstance(self._actor, LearnerGroup):
            self._actor.kill()
        else:
            ray.kill(self._actor, no_restart=True)
