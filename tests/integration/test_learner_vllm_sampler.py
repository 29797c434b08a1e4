"""The learner's penalties and min_tokens against vLLM's own sampler code (no server: its functions on the same logits).

`vllm_sampler_oracle.py` runs in the engine env: MinTokensLogitsProcessor's mask, `apply_penalties` (repetition
over prompt + output, frequency and presence over output), temperature, min-p, `apply_top_k_top_p`, log-softmax.
The learner's `window_logprobs` on the same logits must agree within 1e-5 per token, and without the modelling
must not (vacuity). The server-level check is test_learner_engine_agreement.py's penalty test.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.batch import TrainBatch, pack
from learner.logprobs import window_logprobs
from learner.sampling import SamplingTransform as ST

pytestmark = pytest.mark.integration
ORACLE = Path(__file__).with_name("vllm_sampler_oracle.py")
V, D, N, STOP = 512, 16, 6, (2, 5)
SETTINGS = {
    "repetition": ST(repetition_penalty=1.3), "repetition<1": ST(temperature=0.8, repetition_penalty=0.7),
    "presence": ST(presence_penalty=0.8), "frequency": ST(frequency_penalty=0.6),
    "min_tokens": ST(min_tokens=4, stop_token_ids=STOP),
    "all": ST(temperature=0.9, top_k=50, top_p=0.9, min_p=0.01, repetition_penalty=1.2, presence_penalty=-0.4,
              frequency_penalty=0.3, min_tokens=4, stop_token_ids=STOP),
}


def test_penalties_and_min_tokens_equal_vllms_sampler(engine_python, tmp_path):
    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(0, 40, rng.integers(3, 12)))) for _ in range(N)]  # small id range: repeats
    comps = [[7 if j < 4 and t in STOP else int(t) for j, t in enumerate(rng.integers(0, 40, rng.integers(5, 20)))]
             for _ in range(N)]
    p = pack(TrainBatch(prompts, comps, [[0.0] * len(c) for c in comps], np.zeros(N), np.arange(N)), 8)
    w = jnp.asarray(rng.normal(0, 0.6, (D, V)).astype(np.float32))
    hidden = jnp.asarray(rng.normal(0, 1, (*p.tokens.shape, D)).astype(np.float32))
    head = lambda h: h @ w
    logits = np.asarray(head(hidden))
    where = [(i, len(pr) - 1 + j) for i, (pr, c) in enumerate(zip(prompts, comps)) for j in range(len(c))]
    settings = {k: dict(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, stop=list(STOP),
                        min_tokens=s.min_tokens, repetition=s.repetition_penalty, presence=s.presence_penalty,
                        frequency=s.frequency_penalty) for k, s in SETTINGS.items()}
    obj = lambda x: np.array(x, dtype=object)
    np.savez(tmp_path / "in.npz", logits=np.stack([logits[i, t] for i, t in where]), settings=obj(settings),
             prompts=obj([prompts[i] for i, _ in where]),
             outputs=obj([comps[i][: t - len(prompts[i]) + 1] for i, t in where]),
             targets=np.array([comps[i][t - len(prompts[i]) + 1] for i, t in where]))
    subprocess.run([str(engine_python), str(ORACLE), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")], check=True,
                   capture_output=True)
    engine = np.load(tmp_path / "out.npz")
    idx = tuple(np.array(where).T)
    run = lambda s: np.asarray(jax.jit(lambda h: window_logprobs(h, head, V, p, s, 8, False, False)[0])(hidden))[idx]
    for name, s in SETTINGS.items():
        ok = np.isfinite(engine[name])  # random targets may fall outside vLLM's truncation (the learner keeps them)
        diff = np.abs(run(s) - engine[name])[ok].max()
        gap = np.abs(run(s._replace(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                                    min_tokens=0)) - engine[name])[ok].max()
        print(f"{name}: |learner - vLLM sampler| max {diff:.1e}, without the modelling {gap:.1e} ({ok.sum()} tokens)")
        assert ok.sum() >= 3 and diff <= 1e-5, f"{name}: learner differs from vLLM's sampler by {diff:.2e}"
        assert gap >= 1e-3, f"{name}: without the modelling the gap is only {gap:.1e}: the check is vacuous"
