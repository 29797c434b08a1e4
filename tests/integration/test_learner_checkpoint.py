"""Checkpoints: exact restore in a fresh process (params, optimizer, RNG), keep-last-N, partial writes ignored,
and a readable error when the checkpoint does not fit the config."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from orchestration.update import ScoredSamples, grpo_step
from learner.config import LearnerConfig
from learner.learner import Learner

pytestmark = pytest.mark.integration
CFG = {"devices": {"offset": 2, "count": 2}, "optimizer": {"lr": 1e-2}, "seq_bucket": 16, "checkpoint_keep": 2,
       "grpo": {"micro_batch_size": 4, "mini_batch_size": 4}}  # 2 mini-batches: the RNG shuffle matters


def toy_batch(seed: int) -> ScoredSamples:
    rng = np.random.default_rng(seed)
    comps = [list(rng.integers(3, 49000, 3 + i)) for i in range(8)]
    return ScoredSamples([list(rng.integers(3, 49000, 6)) for _ in range(8)], comps,
                         [list(-rng.random(len(c)) - 1) for c in comps], rng.random(8), np.repeat([0, 1], 4))


FRESH = textwrap.dedent("""
    import json, pickle, sys
    import numpy as np
    from learner.config import LearnerConfig
    from learner.learner import Learner
    from orchestration.update import grpo_step
    cfg_json, model_dir, ckpt, batch_path, out = sys.argv[1:]
    learner = Learner(LearnerConfig.model_validate(json.loads(cfg_json)), model_dir, checkpoint_dir=ckpt)
    step, extra = learner.restore()
    restored = learner.save_for_sampler().tensors
    grpo_step(learner, learner.cfg.grpo, pickle.load(open(batch_path, "rb")))
    after = learner.save_for_sampler().tensors
    np.savez(out, step=step, extra=json.dumps(extra), **{"restored/" + k: v for k, v in restored.items()},
             **{"after/" + k: v for k, v in after.items()})
""")


def test_restore_in_fresh_process_is_exact(tiny_model_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    learner = Learner(LearnerConfig.model_validate(CFG), tiny_model_dir, checkpoint_dir=ckpt)
    assert learner.restore() == (0, {})
    grpo_step(learner, learner.cfg.grpo, toy_batch(0))
    learner.save(1, {"prompt_stream": {"cursor": 17}})
    saved = learner.save_for_sampler().tensors
    batch = toy_batch(1)
    grpo_step(learner, learner.cfg.grpo, batch)
    after = learner.save_for_sampler().tensors

    (tmp_path / "batch.pkl").write_bytes(pickle.dumps(batch))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", FRESH, json.dumps(CFG), str(tiny_model_dir), str(ckpt),
                           str(tmp_path / "batch.pkl"), str(tmp_path / "fresh.npz")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fresh = np.load(tmp_path / "fresh.npz")
    assert int(fresh["step"]) == 1 and json.loads(str(fresh["extra"])) == {"prompt_stream": {"cursor": 17}}
    for name, value in saved.items():
        np.testing.assert_array_equal(fresh[f"restored/{name}"], value, err_msg=f"restored {name} differs")
    # Same next step from the restored state (optimizer moments and shuffle RNG included) -> same weights.
    for name, value in after.items():
        np.testing.assert_array_equal(fresh[f"after/{name}"], value,
                                      err_msg=f"{name} differs after the next step: optimizer state or RNG not restored")


def test_keep_last_n_ignore_partial_and_explain_mismatch(tiny_model_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    learner = Learner(LearnerConfig.model_validate(CFG), tiny_model_dir, checkpoint_dir=ckpt)
    for step in (1, 2, 3):
        learner.save(step, {"step": step})
    assert sorted(p.name for p in ckpt.iterdir() if p.name.isdigit()) == ["2", "3"], "keep=2 not honoured"
    # A write cut off mid-way is left in Orbax's temporary folder: it must never be picked up.
    partial = ckpt / "4.orbax-checkpoint-tmp-1234"
    partial.mkdir()
    (partial / "junk").write_text("half written")
    assert learner.restore() == (3, {"step": 3})

    other = {**CFG, "lora": {"rank": 8}}
    wrong = Learner(LearnerConfig.model_validate(other), tiny_model_dir, checkpoint_dir=ckpt)
    with pytest.raises(ValueError) as err:
        wrong.restore()
    msg = str(err.value)
    assert "layers.0.attn" in msg and "rank 16 in the checkpoint vs 8 in config" in msg, msg
    assert "learner.lora.rank=16" in msg, msg

    fewer = {**CFG, "lora": {"target_modules": ["q_proj", "v_proj"]}}
    with pytest.raises(ValueError, match="exists only in the checkpoint.*learner.lora.target_modules"):
        Learner(LearnerConfig.model_validate(fewer), tiny_model_dir, checkpoint_dir=ckpt).restore()
