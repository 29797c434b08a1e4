"""The Tinker API's operations on aha's parts: one LoRA adapter per training client on the shared learner, samplers
as adapters loaded by name on every engine replica.

A training client (`create_model`) is an adapter of the learner (learner/adapters.py): its forward_backward and
optim_step are the learner handle's, the same primitives a GRPO step is made of, so one learner path serves the
service and `aha train`. `save_weights_for_sampler` exports that adapter's PEFT tensors and loads them into every
engine under a new name, so the sampling client it returns samples exactly that version while training goes on.
Every version stays served: its PEFT folder is kept on the run directory, and one the engines unloaded to make room
for newer ones is loaded again when a request asks for it (orchestration/service/served.py). A named one is loaded
again by `create_sampling_client(model_path=...)` too, by this server or a later one. `save_state` is an Orbax
checkpoint of the adapter with its Adam state, so `load_state` resumes exactly.

Every operation is one blocking call on a handle, run in a worker thread; a training client's operations run in
its seq_id order (orchestration/service/futures.py `Sequencer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import hashlib
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.lora_adapter import LoraAdapter, version_name
from common.storage import exists, local_folder, remove, write_folder
from learner.adapter_api import AdamParams
from learner.config import LoraConfig
from learner.handle import LearnerHandle
from learner.token_batch import TokenBatch
from learner.token_losses import loss_config
from orchestration.config.schema import ServiceConfig
from orchestration.service import paths, wire
from orchestration.service.checkpoints import CheckpointRecords, SaveOptions
from orchestration.service.fair_share import FairShare
from orchestration.service.futures import Outcome, Sequencer, UserError
from orchestration.service.model_name import served_model
from orchestration.service.passes import LearnerPasses
from orchestration.service.sampling import LogprobAsk, answer, logprob_ask, sampling_params, target_params
from orchestration.service.served import ServedAdapters
from rollout.protocol import RolloutHandle

log = logging.getLogger(__name__)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
LORA_ALPHA = 32.0  # a fixed alpha, as Tinker's LoRA recipes use: the update scales as alpha / rank


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


@dataclass
class TrainingModel:
    """One training client: its adapter on the learner and what the SDK asks about it."""

    model_id: str
    base_model: str
    lora: LoraConfig
    user_metadata: dict[str, Any] | None
    sequencer: Sequencer
    newest: str | None = None  # the engine name of its newest unnamed sampler version
    versions: int = 0
    last_request_time: str = field(default_factory=now)

    @property
    def adapter(self) -> str:
        """Its name on the learner and, with a version, on the engines (no ':' in a served LoRA name)."""
        return re.sub(r"[^A-Za-z0-9_-]", "-", self.model_id)


@dataclass
class Sampler:
    sampler_id: str
    adapter: str | None  # the served adapter name; None = the base model
    base_model: str
    model_path: str | None = None
    owner: str | None = None  # the training client of an unnamed version
    inflight: bool = False  # follows its owner's newest version


def training_model_id(session_id: str, seq: int) -> str:
    """The model id of `session_id`'s training client number `seq`: the SDK builds the same id itself."""
    return f"{session_id}:train:{seq}"


class TinkerService:
    """The state behind the routes: sessions, training clients, samplers, and the parts they drive."""

    def __init__(self, cfg: ServiceConfig, learner: LearnerHandle, rollout: RolloutHandle, root: str):
        self.cfg, self.learner, self.rollout, self.root = cfg, learner, rollout, root
        self.records = CheckpointRecords(root, cfg.api.min_checkpoint_ttl_s)
        self.served_model = served_model(cfg.model, cfg.rollout.backend.served_model_name)
        self.vocab_size = vocab_size(cfg.model.config_json)
        self.sessions: dict[str, dict[str, int]] = {}
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, Sampler] = {}
        self.session_metadata: dict[str, dict[str, Any] | None] = {}  # what create_session gave (get_session)
        backend = cfg.rollout.backend
        # every adapter served by name (versions and named checkpoints), at most as many on the engines as their
        # LoRA slots keep (vLLM's max_cpu_loras; one merged adapter on an engine without slots)
        self.served = ServedAdapters(getattr(backend, "max_cpu_loras", 1),
                                     lambda adapter: self.on_engines(self.rollout.serve, adapter),
                                     lambda name: self.on_engines(self.rollout.unserve, name))
        self._session_count = 0
        self.placement: dict[str, Any] = {}  # where the parts run (the CLI fills it in; capabilities report it)
        # Blocking handle calls run in worker threads, the learner's and the engines' in pools of their own: a
        # minutes-long update must not hold the threads sample requests wait for (the SDK sends many at once).
        self._learner_calls = ThreadPoolExecutor(4, thread_name_prefix="tinker-learner")
        self._engine_calls = ThreadPoolExecutor(cfg.rollout.client.max_concurrency, thread_name_prefix="tinker-engine")
        self.fair = FairShare(cfg.rollout.client.max_concurrency)  # no client's samples queue behind another's
        # Several clients' forward_backward in one learner pass, each datum through its client's adapter.
        self.passes = LearnerPasses(self._learner_pass, cfg.learner.tenant_slots, cfg.api.gather_window_s)

    async def on_learner(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._learner_calls, functools.partial(fn, *args))

    async def _learner_pass(self, batch: TokenBatch, loss: str, config: dict[str, float] | None,
                            forward_only: bool) -> dict[str, Any]:
        call = self.learner.forward if forward_only else self.learner.forward_backward
        return await self.on_learner(lambda: call(batch, loss, batch.adapters[0], config).result())

    async def on_engines(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._engine_calls, functools.partial(fn, *args))

    # ---- sessions and capabilities ------------------------------------------------------------------------------
    def create_session(self, user_metadata: dict[str, Any] | None = None) -> str:
        # Unique across servers: a later server writes beside an earlier one's checkpoints under the same root.
        self._session_count += 1
        session_id = f"s{time.time_ns() // 1000:x}{self._session_count}"
        self.sessions[session_id] = {"model": 0, "sampler": 0}
        self.session_metadata[session_id] = user_metadata
        return session_id

    def capabilities(self) -> dict[str, Any]:
        """The models served, and (a key the SDK ignores) where the learner and the engines run."""
        return {"supported_models": [{"model_name": self.served_model.name, "max_context_length":
                                      self.cfg.rollout.backend.max_model_len, "trainable": True, "sampleable": True}],
                "placement": self.placement}

    def check_base(self, base_model: str | None) -> str:
        """The served name (the model's Hugging Face id) for a client's base_model: that id, the config's
        model.path or its folder; another model is a one-line error."""
        return self.served_model.check(base_model)

    def model(self, model_id: str) -> TrainingModel:
        if model_id not in self.models:
            raise UserError(f"no training client {model_id!r} on this server (a server restart forgets them: "
                            "create_training_client_from_state(path) continues from a saved state)")
        return self.models[model_id]

    def get_info(self, model_id: str) -> dict[str, Any]:
        m = self.model(model_id)
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": m.lora.rank,
                "model_name": self.served_model.name, "model_data": self.served_model.model_data()}

    # ---- training clients ---------------------------------------------------------------------------------------
    def new_model(self, session_id: str, seq: int, base_model: str | None, lora: dict[str, Any] | None,
                  user_metadata: dict | None, first_seq: int) -> TrainingModel:
        """A training client of `session_id` (model id `{session}:train:{seq}`, which the SDK builds itself);
        `lora` None: it comes from the checkpoint the client is created from."""
        if session_id not in self.sessions:
            raise UserError(f"no session {session_id!r} on this server")
        model_id = training_model_id(session_id, seq)
        if model_id in self.models:
            raise UserError(f"training client {model_id} exists already")
        config = self.check_rank(LoraConfig(alpha=LORA_ALPHA) if lora is None else lora_config(lora))
        m = TrainingModel(model_id, self.check_base(base_model), config, user_metadata, Sequencer(first_seq))
        self.models[model_id] = m
        return m

    def check_rank(self, lora: LoraConfig) -> LoraConfig:
        max_rank = self.cfg.rollout.backend.max_lora_rank
        if not 1 <= lora.rank <= max_rank:
            raise UserError(f"LoRA rank {lora.rank}: this server's engines serve ranks 1..{max_rank} "
                            "(rollout.backend.max_lora_rank of its config)")
        return lora

    async def create_model(self, m: TrainingModel, seed: int | None) -> Outcome:
        # seed None: a random init, as the SDK documents it (not one init every unseeded client shares)
        seed = secrets.randbits(31) if seed is None else int(seed) % 2**31
        await self.on_learner(lambda: self.learner.add_adapter(m.adapter, m.lora, seed).result())
        await self.on_learner(self._write_run, m)
        log.info("training client %s: LoRA rank %d on %s", m.model_id, m.lora.rank, m.base_model)
        return Outcome(json={"model_id": m.model_id, "type": "create_model"})

    async def forward_backward(self, m: TrainingModel, body: bytes, forward_only: bool) -> Outcome:
        request = wire.read_forward_backward(body)
        batch = wire.token_batch(request)
        check_datum_ids(batch, self.vocab_size)
        config = wire.loss_settings(request)
        loss_config(request.loss_fn, config)  # an unknown loss or setting: one line now, not after the queue
        out = await self.passes.submit(m.adapter, batch, request.loss_fn, config, forward_only)
        m.last_request_time = now()
        return Outcome(proto=wire.forward_backward_output(out["logprobs"], {"loss:sum": out["loss"]}))

    async def optim_step(self, m: TrainingModel, adam: dict[str, Any] | None) -> Outcome:
        if adam is None:
            raise UserError("optim_step without adam_params: this server's optimizer is AdamW")
        params = AdamParams(**{k: float(adam[k]) for k in ("learning_rate", "beta1", "beta2", "eps", "weight_decay",
                                                           "grad_clip_norm") if k in adam})
        out = await self.on_learner(lambda: self.learner.optim_step(m.adapter, params).result())
        m.last_request_time = now()
        return Outcome(json={"metrics": {"optim/grad_norm:mean": out["learner/grad_norm"]}})

    async def save_state(self, m: TrainingModel, name: str, keep: SaveOptions) -> Outcome:
        path = paths.TinkerPath(m.model_id, "weights", paths.checked_name(name))
        await self.on_learner(self._make_room_for, path, keep)
        await self.on_learner(lambda: self.learner.save_state(m.adapter, path.location(self.root)).result())
        await self.on_learner(self.records.note, path, keep.ttl_seconds, keep.user_metadata)
        return Outcome(json={"path": str(path), "type": "save_weights"})

    async def save_external(self, m: TrainingModel, name: str, keep: SaveOptions) -> Outcome:
        """The LoRA as a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) at
        `tinker://<model_id>/external_weights/<name>`, which `tinker checkpoint download` fetches file by file."""
        path = paths.TinkerPath(m.model_id, "external_weights", paths.checked_name(name))
        lora = await self.on_learner(self.learner.save_for_sampler, m.adapter)
        await self.on_learner(self._make_room_for, path, keep)
        await self.on_learner(self._write_peft, path, lora)
        await self.on_learner(self.records.note, path, keep.ttl_seconds, keep.user_metadata)
        return Outcome(json={"path": str(path), "type": "save_weights_external"})

    def _make_room_for(self, path: paths.TinkerPath, keep: SaveOptions) -> None:
        """A name saved before is replaced only with overwrite (save_state's default is False, as Tinker's)."""
        if self.records.is_saved(path):
            if not keep.overwrite:
                raise UserError(f"{path} exists already: pass overwrite=True to replace it, or save under another "
                                "name")
            remove(path.location(self.root))

    async def load_state(self, m: TrainingModel, path: str, optimizer: bool) -> Outcome:
        where = paths.parse(path, ("weights",))
        location = where.location(self.root)
        await self.on_learner(self._sweep_run, where)
        if not await self.on_learner(exists, location):
            raise UserError(f"{path}: no saved state there ({location})")
        lora = await self.on_learner(lambda: self.learner.load_state(m.adapter, location, optimizer).result())
        m.lora = self.check_rank(lora)
        await self.on_learner(self._write_run, m)
        return Outcome(json={"path": path, "model_id": m.model_id, "type": "load_weights"})

    async def save_for_sampler(self, m: TrainingModel, name: str | None, sampler_seq: int | None,
                               session_id: str, kind: str = "snapshot", keep: SaveOptions = SaveOptions()) -> Outcome:
        """A new sampler version of `m`: served by every engine; a named one also kept in the run directory.
        kind "inflight": the sampler follows `m`'s newest version (the weights saved when it was made, or newer)."""
        if kind not in ("snapshot", "inflight"):
            raise UserError(f"sampling client kind {kind!r}: this server makes 'snapshot' and 'inflight' ones")
        if name is not None:
            lora = await self.on_learner(self.learner.save_for_sampler, m.adapter)
            path = paths.TinkerPath(m.model_id, "sampler_weights", paths.checked_name(name))
            await self.on_learner(self._make_room_for, path, keep)
            await self.on_learner(self._write_peft, path, lora)
            await self.on_learner(self.records.note, path, keep.ttl_seconds, keep.user_metadata)
            return Outcome(json={"path": str(path), "type": "save_weights_for_sampler"})
        m.versions += 1
        lora = await self.on_learner(self.learner.save_for_sampler, m.adapter, version_name(m.adapter, m.versions))
        # its folder on the run directory, read again when the engines have unloaded it to make room for others
        folder = paths.TinkerPath(m.model_id, paths.VERSIONS, f"v{m.versions}")
        await self.on_learner(self._write_peft, folder, lora)
        await self.served.add(lora, lambda: self.on_engines(self._read_peft, folder, lora.name))
        m.newest = lora.name
        sampler_id = self.new_sampler(session_id, sampler_seq, lora.name, m.base_model, owner=m.model_id)
        self.samplers[sampler_id].inflight = kind == "inflight"
        return Outcome(json={"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"})

    # ---- samplers -----------------------------------------------------------------------------------------------
    def new_sampler(self, session_id: str, seq: int | None, adapter: str | None, base_model: str,
                    model_path: str | None = None, owner: str | None = None) -> str:
        counters = self.sessions.setdefault(session_id, {"model": 0, "sampler": 0})
        seq = counters["sampler"] if seq is None else seq
        counters["sampler"] = max(counters["sampler"], seq + 1)
        sampler_id = f"{session_id}:sample:{seq}"
        self.samplers[sampler_id] = Sampler(sampler_id, adapter, base_model, model_path, owner)
        return sampler_id

    async def sampler_for_path(self, session_id: str, seq: int | None, model_path: str) -> str:
        """A sampler of a named checkpoint (sampler_weights, or a training state's weights exported anew)."""
        where = paths.parse(model_path)
        await self.on_engines(self._sweep_run, where)
        if not await self.on_engines(exists, where.location(self.root)):  # deleted or expired (even if still served)
            raise UserError(f"{model_path}: no checkpoint there ({where.location(self.root)})")
        served = "ckpt-" + hashlib.sha256(str(where).encode()).hexdigest()[:16]
        if served not in self.served:
            if where.kind == "sampler_weights":
                source = lambda: self.on_engines(self._read_peft, where, served)  # noqa: E731
            else:  # a training state: its LoRA, through a scratch adapter on the learner
                source = lambda: self.on_learner(self._weights_as_peft, where, served)  # noqa: E731
            await self.served.add(await source(), source)
        return self.new_sampler(session_id, seq, served, self.served_model.name, model_path)

    def sampler(self, sampler_id: str) -> Sampler:
        if sampler_id not in self.samplers:
            raise UserError(f"no sampling client {sampler_id!r} on this server")
        return self.samplers[sampler_id]

    def prompt_of(self, body: dict[str, Any]) -> list[int]:
        """A sample request's prompt tokens (text chunks only)."""
        return [t for chunk in body["prompt"]["chunks"] for t in self._chunk_tokens(chunk)]

    def logprob_ask(self, body: dict[str, Any]) -> LogprobAsk:
        """The request's logprob options, checked before it is queued (a 400 for one the engines cannot answer)."""
        backend = self.cfg.rollout.backend
        return logprob_ask(body, len(self.prompt_of(body)), backend.kind, backend.max_logprobs)

    async def sample(self, sampler: Sampler, body: dict[str, Any]) -> Outcome:
        adapter = self.models[sampler.owner].newest if sampler.inflight else sampler.adapter
        prompt = self.prompt_of(body)
        check_ids(prompt, self.vocab_size, "the prompt")
        ask = self.logprob_ask(body)
        room = self.cfg.rollout.backend.max_model_len - len(prompt)
        if room < 1:
            raise UserError(f"the prompt's {len(prompt)} tokens leave no room to sample in the context of "
                            f"{self.cfg.rollout.backend.max_model_len} (rollout.backend.max_model_len)")
        params = sampling_params(body.get("sampling_params") or {}, int(body.get("num_samples", 1)), room, ask)
        # an adapter is loaded again first if the engines had unloaded it
        async with contextlib.nullcontext() if adapter is None else self.served.use(adapter):
            async with self.fair.turn(sampler.sampler_id.split(":")[0]):  # clients take turns by session
                [group] = await self.on_engines(lambda: self.rollout.generate([prompt], params, adapter=adapter))
            scored = await self._score_targets(prompt, ask, adapter)
        return Outcome(proto=wire.sample_response(group, answer(group, prompt, ask, scored)))

    async def _score_targets(self, prompt: list[int], ask: LogprobAsk, adapter: str | None) -> dict[int, Any]:
        """target_prompt_logprobs: one request per row that names ids, its prefix the prompt up to that position
        (the engine's prefix cache shares the prefill between them)."""
        if ask.target is None:
            return {}
        rows = ask.target.rows()
        check_ids([t for ids in rows.values() for t in ids], self.vocab_size, "target_prompt_logprobs")

        async def score(row: int) -> Any:
            [[out]] = await self.on_engines(lambda: self.rollout.generate([prompt[:row + 1]], target_params(rows[row]),
                                                                          adapter=adapter))
            return out

        return dict(zip(rows, await asyncio.gather(*map(score, rows))))

    @staticmethod
    def _chunk_tokens(chunk: dict[str, Any]) -> list[int]:
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise UserError(f"a {chunk.get('type')} chunk in the prompt; this server samples from text tokens")
        return [int(t) for t in chunk["tokens"]]

    # ---- checkpoints on storage ---------------------------------------------------------------------------------
    def _write_peft(self, path: paths.TinkerPath, lora: LoraAdapter) -> None:
        write_folder(path.location(self.root), lora.write)

    def _read_peft(self, path: paths.TinkerPath, name: str) -> LoraAdapter:
        """The PEFT folder at `path`, to be served as `name`."""
        location = path.location(self.root)
        if not exists(location):
            raise UserError(f"{path}: no sampler weights there ({location})")
        with local_folder(location) as folder:
            return LoraAdapter.read(folder, name)

    def _weights_as_peft(self, path: paths.TinkerPath, scratch: str) -> LoraAdapter:
        """A training state's LoRA, through the learner adapter `scratch` (also the name it is served as)."""
        location = path.location(self.root)
        if not exists(location):
            raise UserError(f"{path}: no saved state there ({location})")
        self.learner.load_state(scratch, location, optimizer=False).result()
        try:
            return self.learner.save_for_sampler(scratch)
        finally:
            self.learner.drop_adapter(scratch).result()

    def _write_run(self, m: TrainingModel) -> None:
        modules = set(m.lora.target_modules)
        self.records.write_run(m.model_id, {
            "training_run_id": m.model_id, "base_model": m.base_model, "model_owner": "aha", "is_lora": True,
            "corrupted": False, "lora_rank": m.lora.rank, "user_metadata": m.user_metadata,
            "train_attn": bool(modules & set(ATTENTION)), "train_mlp": bool(modules & set(MLP)),
            "train_unembed": False})

    def _sweep_run(self, path: paths.TinkerPath) -> None:
        """Expired checkpoints of `path`'s run deleted first, so an expired one is never loaded."""
        with contextlib.suppress(KeyError):
            self.records.checkpoints(path.model_id)

    def training_run(self, model_id: str) -> dict[str, Any]:
        m = self.models.get(model_id)
        return self.records.training_run(model_id, m.last_request_time if m else None)


def vocab_size(config_json: Any) -> int:
    """The base model's vocabulary (its embedding's rows): token ids from 0 to this minus one."""
    if config_json is None:
        raise ValueError("the base model has no config.json (model.path's folder, or configs/models/<name>/)")
    config = json.loads(config_json.read_text())
    return int(config.get("vocab_size") or config["text_config"]["vocab_size"])


def check_ids(ids: Any, vocab: int, where: str) -> None:
    """A user error naming `where` and the first id outside 0..vocab-1 (the learner's gather would clamp it to a
    silently wrong number; the engine would fail the request as its own error)."""
    ids = np.asarray(ids, np.int64)
    bad = np.argwhere((ids < 0) | (ids >= vocab))  # [N] ids, or [N, K] soft targets
    if len(bad):
        raise UserError(f"{where}: token id {int(ids[tuple(bad[0])])} at position {int(bad[0][0])} is outside the "
                        f"model's vocabulary (0..{vocab - 1})")


def check_datum_ids(batch: TokenBatch, vocab: int) -> None:
    for i, (tokens, targets) in enumerate(zip(batch.tokens, batch.targets)):
        check_ids(tokens, vocab, f"datum {i} model_input")
        check_ids(targets, vocab, f"datum {i} loss_fn_inputs['target_tokens']")


def lora_config(given: dict[str, Any]) -> LoraConfig:
    """The SDK's LoraConfig (rank, train_attn, train_mlp, train_unembed) as the learner's. The unembedding is not
    adapted here: LoRA sits on the attention and MLP projections (learner.lora.target_modules' choices), and the
    SDK sends train_unembed=True by default, so refusing it would refuse every default client."""
    targets = (ATTENTION if given.get("train_attn", True) else ()) + (MLP if given.get("train_mlp", True) else ())
    if not targets:
        raise UserError("LoRA config trains neither attention nor MLP: set train_attn or train_mlp")
    return LoraConfig(rank=int(given.get("rank", 32)), alpha=LORA_ALPHA, target_modules=targets)
