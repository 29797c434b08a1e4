"""How a run's parts split the model and the chips, checked before anything starts.

Each rule below is one an engine, Ray or libtpu applies later, minutes into a run and far from the key that broke it:
- tensor parallelism divides the model's attention heads, and its KV heads the way vLLM splits them: a KV head
  count at or above the TP size is divided by it, one below is replicated, so TP must be a multiple of it
  (vllm 0.32.0 vllm/config/model.py:1546 `verify_with_parallel_config`; `QKVParallelLinear`,
  vllm/model_executor/layers/linear.py:1053-1057; tpu-inference 0.32.0 replicates the same way,
  tpu_inference/layers/common/attention_interface.py:456-459). Head counts come from the model's config.json;
- on TPU an engine shards over exactly the chips Ray gives its actor: tensor_parallel_size = rollout.resources.tpu;
- Ray's `TPU` resource takes 1, 2, 4 or 8 chips per actor (ray/_private/accelerators/tpu.py:23), so a host's chips
  split into whole groups for engine replicas and learner processes;
- `learner.topology` (what preflight compiles for) is the learner's chips: learner.hosts x learner.resources.tpu,
  and a learner on several hosts takes whole hosts of a multi-host slice (4 chips each, ray tpu.py:60).
`check_parallelism` raises the first broken rule as one line; `report` states what was checked (preflight prints it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestration.cluster.tpu_env import CHIPS_PER_HOST_MULTIHOST, VALID_CHIPS, Topology


def heads(hf: dict[str, Any]) -> tuple[int, int]:
    """(attention heads, KV heads) from a config.json (a multimodal config's text part when it has one)."""
    text = hf.get("text_config") or hf
    total = int(text["num_attention_heads"])
    return total, int(text.get("num_key_value_heads") or total)


def tp_problem(tp: int, hf: dict[str, Any]) -> str | None:
    """Why vLLM would refuse tensor parallel size `tp` for this model; None when it splits."""
    q, kv = heads(hf)
    if q % tp:
        fits = [d for d in range(1, q + 1) if q % d == 0 and not _kv_problem(d, kv)]
        return (f"does not divide the model's {q} attention heads; vLLM refuses to start (use one of "
                f"{', '.join(map(str, fits))})")
    return _kv_problem(tp, kv)


def _kv_problem(tp: int, kv: int) -> str | None:
    if kv >= tp and kv % tp:
        return f"does not divide the model's {kv} KV heads (vLLM splits KV heads over TP when there are enough)"
    if kv < tp and tp % kv:
        return f"is not a multiple of the model's {kv} KV heads (vLLM replicates KV heads when TP exceeds them)"
    return None


def _check_chips(section: str, chips: float) -> None:
    if chips and chips not in VALID_CHIPS:
        raise ValueError(f"{section}.resources.tpu ({chips:g}): Ray's TPU resource takes "
                         f"{', '.join(map(str, VALID_CHIPS))} chips per actor; use one of them")


def check_learner_chips(topology: str, hosts: int, chips: float) -> None:
    """learner.topology is hosts x chips per host, in whole hosts of a multi-host slice when hosts > 1."""
    _check_chips("learner", chips)
    if not chips:
        return  # a CPU or GPU learner: the topology only says what preflight compiles for
    parsed = Topology.parse(topology)
    if parsed is None:
        raise ValueError(f"learner.resources.tpu is {chips:g} but learner.topology is cpu; set learner.topology to "
                         "the learner's chips (e.g. v5e:2x2 for 4 v5e chips) so preflight checks what will run")
    if parsed.chips != hosts * chips:
        raise ValueError(f"learner.topology {topology} has {parsed.chips} chips but learner.hosts ({hosts}) x "
                         f"learner.resources.tpu ({chips:g}) = {hosts * chips:g}; make them equal")
    if hosts > 1 and chips != CHIPS_PER_HOST_MULTIHOST:
        per_host = CHIPS_PER_HOST_MULTIHOST
        raise ValueError(f"learner.hosts={hosts} spans hosts of a multi-host slice, which hold {per_host} chips each; "
                         f"set learner.resources.tpu: {per_host}")
    if hosts > 1:
        parsed.host_grid()  # raises when the topology does not split into whole hosts


def check_engine_chips(backend, chips: float, hf_path: Path | None) -> None:
    """Engine chips and tensor parallelism against Ray's chip groups and the model's heads."""
    _check_chips("rollout", chips)
    tp = backend.tensor_parallel_size
    if getattr(backend, "platform", "cpu") == "tpu" and chips and tp != chips:
        raise ValueError(f"rollout.backend.tensor_parallel_size ({tp}) differs from rollout.resources.tpu "
                         f"({chips:g}): vllm-tpu shards the model over exactly its actor's chips; make them equal")
    hf = json.loads(hf_path.read_text()) if tp > 1 and hf_path is not None else {}
    if "num_attention_heads" in (hf.get("text_config") or hf) and (why := tp_problem(tp, hf)):
        raise ValueError(f"rollout.backend.tensor_parallel_size ({tp}) {why} ({hf_path})")


def report(cfg, hf: dict[str, Any]) -> str:
    """One line: the placement and parallelism the config asks for, as checked."""
    lr, rr, backend = cfg.learner.resources, cfg.rollout.resources, cfg.rollout.backend
    q, kv = heads(hf)
    unit = "chips" if lr.tpu else "CPUs"
    learner = (f"learner {cfg.learner.hosts} process(es) x {lr.tpu or lr.num_cpus:g} {unit}"
               + (f" = {cfg.learner.topology}" if lr.tpu else ""))
    engine = (f"engine {cfg.rollout.replicas} replica(s) x {rr.tpu:g} chips" if rr.tpu else
              f"engine {cfg.rollout.replicas} replica(s) on {backend.platform}")
    return (f"preflight: parts: {learner}; {engine}, tensor parallel {backend.tensor_parallel_size} over the model's "
            f"{q} attention / {kv} KV heads")
