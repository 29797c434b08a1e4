"""`tinker://` paths and where they live: `tinker://<model_id>/<weights|sampler_weights>/<name>` is a folder under
the service's run directory (a local path or gs://, so any host of the cluster and a later server read it):
`<root>/tinker/<model_id>/<kind>/<name>/`. Unnamed sampler versions keep their folders in `sampler_versions/v<n>/`
beside them, so the engines can load one again after unloading it. `weights` hold an Orbax checkpoint of the LoRA and its Adam state
(learner/learner.py `save_state`), `sampler_weights` a PEFT adapter folder (what the engines load and peft reads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from common.storage import join

SCHEME = "tinker://"
KINDS = ("weights", "sampler_weights")
VERSIONS = "sampler_versions"  # the unnamed sampler versions' PEFT folders (no tinker:// path names them)
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@dataclass(frozen=True)
class TinkerPath:
    model_id: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.model_id}/{self.kind}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        return f"{self.kind}/{self.name}"

    def location(self, root: str) -> str:
        """The folder (local path or URI) that holds it."""
        return join(root, "tinker", self.model_id, self.kind, self.name)


def join_run(root: str, model_id: str, name: str) -> str:
    """A file of a training client's record beside its checkpoints (run.json, checkpoints.jsonl)."""
    return join(root, "tinker", model_id, name)


def parse(path: str, kinds: tuple[str, ...] = KINDS) -> TinkerPath:
    """A tinker:// path of one of `kinds`; a one-line error naming the expected form otherwise."""
    parts = path.removeprefix(SCHEME).split("/") if path.startswith(SCHEME) else []
    if len(parts) != 3 or parts[1] not in kinds or not _NAME.match(parts[2]) or not parts[0]:
        raise ValueError(f"{path!r} is not a path this server wrote: expected {SCHEME}<model_id>/<"
                         f"{'|'.join(kinds)}>/<name>")
    return TinkerPath(*parts)


def checked_name(name: str) -> str:
    """A checkpoint name the client chose (save_state, save_weights_for_sampler)."""
    if not _NAME.match(name):
        raise ValueError(f"checkpoint name {name!r}: use 1-128 letters, digits, '_', '.' or '-'")
    return name
