"""Several adapters in one learner pass (learner/tenant_stack.py, learner/lora_rows.py): a tenant's losses, logprobs
and updated LoRA are what it gets alone within float32 rounding (BOUND), whatever its neighbours' ranks; a tenant of
a compiled rank joins a pass without a compile. Fails on the old main: a TokenBatch there had no per-datum adapters,
and the learner one program per adapter."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from learner.adapter_api import AdamParams
from learner.config import LearnerConfig, LoraConfig
from learner.learner import Learner
from learner.token_batch import TokenBatch

pytestmark = pytest.mark.integration
RANKS = {"a": 4, "b": 8, "c": 16, "d": 2}
ADAM = AdamParams(learning_rate=1e-2)
# Beside others a tenant's rows go through a batched contraction (each row with its gathered adapter) where alone
# they go through the adapter's own matmuls: float32 rounding of another order, nothing more.
BOUND = {"loss": 1e-5, "logprobs": 1e-4, "lora": 1e-5}


def datums(n: int, seed: int, loss: str) -> list[tuple[list[int], list[int], dict]]:
    """`n` datums of different lengths, a prompt part without loss (its gate input 0) and a trained part."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(8, 40))
        tokens = rng.integers(3, 1000, length + 1).tolist()
        gate = (np.arange(length) >= length // 3).astype(np.float32)
        inputs = {"weights": gate} if loss == "cross_entropy" else {
            "advantages": gate * rng.normal(size=length).astype(np.float32),
            "logprobs": -rng.random(length).astype(np.float32) - 1.0}
        out.append((tokens[:-1], tokens[1:], inputs))
    return out


def groups(prompts: list[list[int]], samples: int, seed: int) -> list[tuple[list[int], list[int], dict]]:
    """RL datums: `samples` completions of each prompt, the prompt's advantages 0 (no gradient there)."""
    rng = np.random.default_rng(seed)
    out = []
    for prompt in prompts:
        for _ in range(samples):
            tokens = prompt + rng.integers(3, 1000, int(rng.integers(3, 8))).tolist()
            n = len(tokens) - 1
            adv = np.where(np.arange(n) >= len(prompt) - 1, rng.normal(), 0.0).astype(np.float32)
            out.append((tokens[:-1], tokens[1:], {"advantages": adv, "logprobs": -rng.random(n).astype(np.float32)}))
    return out


@pytest.fixture(scope="module")
def learner(tiny_model_dir):
    return Learner(LearnerConfig.model_validate({"lora": {"rank": 4, "alpha": 16}}), tiny_model_dir)


def fresh(learner: Learner, names: list[str]) -> dict[str, list[np.ndarray]]:
    """The adapters `names` as at their creation, their B moved off 0 so every one changes the logprobs; returns
    their weights."""
    for name in names:
        learner.drop_adapter(name)
        learner.add_adapter(name, LoraConfig(rank=RANKS[name], alpha=16 if name != "c" else 32), seed=RANKS[name])
        keys = iter(jax.random.split(jax.random.key(RANKS[name]), 1000))
        a = learner.adapters[name]
        a.params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), a.params)
    return {name: weights(learner, name) for name in names}


def batch(clients: dict[str, list], tagged: bool = True) -> TokenBatch:
    rows = [(name, d) for name, ds in clients.items() for d in ds]
    return TokenBatch([d[0] for _, d in rows], [d[1] for _, d in rows], [d[2] for _, d in rows],
                      tuple(name for name, _ in rows) if tagged else ())


def weights(learner: Learner, name: str) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(learner.adapters[name].params)]


def alone_and_together(learner: Learner, clients: dict[str, list], loss: str, forward_only: bool = False):
    """(per client: (loss, logprobs, LoRA after an optim_step) alone; the same from one pass of all of them; each
    client's LoRA before either)."""
    call = learner.forward if forward_only else learner.forward_backward
    fresh(learner, list(clients))
    alone = {}
    for name, ds in clients.items():
        out = call(batch({name: ds}, tagged=False), loss, name)
        if not forward_only:
            learner.optim_step(name, ADAM)
        alone[name] = (out["loss"], out["logprobs"], weights(learner, name))
    created = fresh(learner, list(clients))
    out = call(batch(clients), loss)
    together, start = {}, 0
    for name, ds in clients.items():
        if not forward_only:
            learner.optim_step(name, ADAM)
        together[name] = (out["adapter_loss"][name], out["logprobs"][start:start + len(ds)], weights(learner, name))
        start += len(ds)
    return alone, together, created


def gaps(alone: dict, together: dict) -> dict[str, float]:
    """The largest differences between a tenant alone and beside others: relative in the summed loss, absolute in
    the logprobs and in the updated LoRA weights."""
    out = {"loss": 0.0, "logprobs": 0.0, "lora": 0.0}
    for name, (loss, logprobs, lora) in alone.items():
        t_loss, t_logprobs, t_lora = together[name]
        out["loss"] = max(out["loss"], abs(t_loss - loss) / max(abs(loss), 1e-30))
        out["logprobs"] = max([out["logprobs"], *(float(np.max(np.abs(x - y))) for x, y in zip(t_logprobs, logprobs))])
        out["lora"] = max([out["lora"], *(float(np.max(np.abs(x - y))) for x, y in zip(t_lora, lora))])
    print("alone vs together:", {k: f"{v:.1e}" for k, v in out.items()})
    return out


def assert_moved(alone: dict, created: dict) -> None:
    """Each client's step moved its LoRA well past the bound the comparison allows (else it compares nothing)."""
    for name, (_, _, lora) in alone.items():
        changed = max(float(np.max(np.abs(x - y))) for x, y in zip(lora, created[name]))
        assert changed > 100 * BOUND["lora"], f"vacuous: {name}'s LoRA moved by {changed:.1e} only"


@pytest.mark.parametrize("loss, names", [("cross_entropy", "abc"), ("ppo", "ac")])
def test_each_tenant_gets_what_it_gets_alone(learner, loss, names):
    """Three clients of ranks 4, 8, 16 (cross-entropy) and two of ranks 4, 16 (PPO) in one pass: each one's summed
    loss, per-datum logprobs and LoRA after its own AdamW step equal those of its pass alone within BOUND (float32
    rounding of a batched contraction)."""
    clients = {name: datums(2 + i, seed=i, loss=loss) for i, name in enumerate(names)}
    alone, together, created = alone_and_together(learner, clients, loss)
    assert_moved(alone, created)
    found = gaps(alone, together)
    assert all(found[k] <= BOUND[k] for k in BOUND), f"a tenant's results moved with its neighbours: {found}"
    logps = [together[name][1][0][-1] for name in clients]
    assert len(set(map(float, logps))) == len(logps), "vacuous: the adapters give one datum's last logprob alike"


def test_tenants_share_their_own_prompts_only(learner):
    """Two clients' RL groups on the same two prompts (a 200-token prompt, 4 short completions each): the pass runs
    each distinct (client, prompt) once, as each client's pass alone does, and each gets what it gets alone. With the
    prompts not told apart by client, b's rows would read a's prompt pass (through a's adapter) and differ."""
    rng = np.random.default_rng(5)
    # long enough that a prompt block saves tokens with the 4-way data-parallel mesh (4 prompt rows at least)
    prompts = [rng.integers(3, 1000, 200).tolist() for _ in range(2)]
    clients = {"a": groups(prompts, 4, seed=1), "c": groups(prompts, 4, seed=2)}
    alone, together, created = alone_and_together(learner, clients, "importance_sampling")
    assert_moved(alone, created)
    found = gaps(alone, together)
    assert all(found[k] <= BOUND[k] for k in BOUND), f"a tenant's results moved with its neighbours: {found}"
    assert learner._layout is not None, "vacuous: the pass shared no prompt"


def test_forward_alone_and_together_agree_and_hold_no_gradient(learner):
    clients = {name: datums(3, seed=10 + i, loss="cross_entropy") for i, name in enumerate("ab")}
    alone, together, _ = alone_and_together(learner, clients, "cross_entropy", forward_only=True)
    found = gaps(alone, together)
    assert found["logprobs"] <= BOUND["logprobs"] and found["loss"] <= BOUND["loss"], found
    assert found["lora"] == 0.0
    for name in clients:
        assert learner.adapters[name].grads is None, "a forward held a gradient"


def test_a_new_tenant_of_a_compiled_rank_compiles_nothing(learner):
    """A pass of (a, b, c) compiles the stacked program once; (d, b, c), d a new client of rank 2 (padded to the
    same rank 16 and the same slots), runs it again without a compile (the first pass's compile is asserted too, so
    the figure is not vacuous)."""
    loss = "importance_sampling"  # a loss no other test of the module runs: its program is new here
    first = {name: datums(3, seed=20, loss=loss) for name in "abc"}
    fresh(learner, list(first))
    out = learner.forward_backward(batch(first), loss)
    assert out["compile_s"] > 0.5, "vacuous: these shapes were compiled before"
    fresh(learner, ["d"])
    out = learner.forward_backward(batch({"d": first["a"], "b": first["b"], "c": first["c"]}), loss)
    assert out["compile_s"] < 0.5, f"the pass compiled its program again ({out['compile_s']:.1f} s)"
    assert learner.adapters["d"].grads is not None
