"""How the Tinker service gathers clients' forward / forward_backward into learner passes
(orchestration/service/passes.py): requests that wait while a pass runs share the next, one per client and one loss
kind per pass, each client gets its own datums' results, and a pass that fails reaches only the client whose datum
caused it. The learner here is a function that records what it was given (the real learner's side is
tests/integration/test_tenant_pass.py)."""

from __future__ import annotations

import asyncio

import numpy as np

from learner.token_batch import TokenBatch
from orchestration.service.passes import LearnerPasses


def datums(n: int, first: int) -> TokenBatch:
    return TokenBatch([[first + i, 7] for i in range(n)], [[7, first + i] for i in range(n)],
                      [{"weights": np.ones(2, np.float32)} for _ in range(n)])


class Recorder:
    """Runs a pass: each datum's logprobs are its first token, each adapter's loss its datum count; a datum whose
    first token is 666 fails the pass."""

    def __init__(self) -> None:
        self.passes: list[tuple[tuple[str, ...], str, bool]] = []

    async def __call__(self, batch: TokenBatch, loss: str, config, forward_only: bool) -> dict:
        self.passes.append((batch.adapters, loss, forward_only))
        await asyncio.sleep(0.05)
        if any(t[0] == 666 for t in batch.tokens):
            raise ValueError("datum 666 is bad")
        losses: dict[str, float] = {}
        for name in batch.adapters:
            losses[name] = losses.get(name, 0.0) + 1.0
        return {"adapter_loss": losses, "logprobs": [np.array([t[0]], np.float32) for t in batch.tokens]}


def run(calls):
    async def main():
        learner = Recorder()
        passes = LearnerPasses(learner, slots=4, window_s=0.0)
        results = await asyncio.gather(*(call(passes) for call in calls), return_exceptions=True)
        return learner.passes, results

    return asyncio.run(main())


async def later(seconds: float, request):
    await asyncio.sleep(seconds)
    return await request


def test_requests_that_wait_share_the_next_pass_and_get_their_own_results():
    """a's request finds the learner idle and runs alone; b, c and d arrive while it runs and share the next."""
    calls = [lambda p, c=c, i=i: later(0.0 if c == "a" else 0.01, p.submit(c, datums(2, 10 * i), "cross_entropy",
                                                                            None, False))
             for i, c in enumerate(["a", "b", "c", "d"])]
    passes, results = run(calls)
    assert [p[0] for p in passes] == [("a", "a"), ("b", "b", "c", "c", "d", "d")], passes
    for i, out in enumerate(results):
        assert out["loss"] == 2.0 and [float(x[0]) for x in out["logprobs"]] == [10 * i, 10 * i + 1]


def test_one_request_per_client_and_one_loss_kind_per_pass():
    calls = [lambda p: p.submit("a", datums(1, 1), "cross_entropy", None, False),
             lambda p: p.submit("b", datums(1, 2), "cross_entropy", None, False),
             lambda p: p.submit("b", datums(1, 3), "cross_entropy", None, False),
             lambda p: p.submit("c", datums(1, 4), "ppo", None, False),
             lambda p: p.submit("d", datums(1, 5), "cross_entropy", None, True)]
    passes, results = run(calls)
    assert passes == [(("a", "b"), "cross_entropy", False), (("b",), "cross_entropy", False),
                      (("c",), "ppo", False), (("d",), "cross_entropy", True)], passes
    assert not any(isinstance(r, Exception) for r in results)


def test_a_failed_pass_fails_only_the_client_whose_datum_caused_it():
    calls = [lambda p: p.submit("a", datums(1, 1), "cross_entropy", None, False),
             lambda p: p.submit("b", datums(1, 2), "cross_entropy", None, False),
             lambda p: p.submit("bad", datums(1, 666), "cross_entropy", None, False),
             lambda p: p.submit("c", datums(1, 3), "cross_entropy", None, False)]
    passes, results = run(calls)
    assert isinstance(results[2], ValueError) and "666" in str(results[2])
    for i in (0, 1, 3):
        assert not isinstance(results[i], Exception) and results[i]["loss"] == 1.0, results[i]
    assert len(passes[0][0]) == 4, f"vacuous: the bad datum never shared a pass ({passes})"
