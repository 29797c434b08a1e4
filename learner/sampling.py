"""SamplingTransform: the engine's sampling transform, as the learner must reproduce it (one type end to end).

The engine samples from processed logits, not from the model's softmax. vLLM's order (v1/sample/sampler.py,
`Sampler.forward` and `apply_logits_processors`, vLLM 0.11+), which the learner follows:
1. logits in float32;
2. min_tokens: while fewer than `min_tokens` tokens have been generated, every id of
   `SamplingParams.all_stop_token_ids` (the tokenizer's eos, generation_config's eos ids, `stop_token_ids`;
   eos is added even with ignore_eos) gets -inf (`MinTokensLogitsProcessor`);
3. penalties (`model_executor/layers/utils.apply_penalties`): repetition on tokens seen in the prompt *or* the
   earlier completion (z > 0: z / r, else z * r); then z -= frequency * count and z -= presence * (count > 0),
   counting the earlier *completion* tokens only (OpenAI's definition);
4. temperature; 5. min-p; 6. top-k, then top-p; 7. log-softmax of what is left (`processed_logprobs`).
Not modelled: logit_bias, bad_words, allowed_token_ids (the run config refuses them while IS is on).

No JAX here (the rule of which transforms need token history is rollout's `needs_history`, shared with the
run config's check): the driver builds this (orchestration/loop.py `scored_samples`) and it travels in `TrainBatch`.
It is hashable and static under jit: a run compiles once per transform.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

from common.sampling import needs_history


class SamplingTransform(NamedTuple):
    """Every sampling knob that changes the distribution the engine samples (and reports logprobs) from."""

    temperature: float = 1.0
    top_k: int = 0  # <= 0: off
    top_p: float = 1.0  # >= 1: off
    min_p: float = 0.0  # <= 0: off
    repetition_penalty: float = 1.0  # 1: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()  # what min_tokens masks: eos ids + stop_token_ids

    @property
    def truncates(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def penalises(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def masks_stop(self) -> bool:
        return self.min_tokens > 0 and len(self.stop_token_ids) > 0

    @property
    def needs_history(self) -> bool:
        """Whether a position's transform depends on the tokens before it (penalties, min_tokens)."""
        return needs_history(self)

    @classmethod
    def of(cls, params: Any, eos_token_ids: tuple[int, ...] | list[int] = ()) -> SamplingTransform:
        """From an engine request's sampling parameters (common.sampling.SamplingParams or anything with its
        field names) and the model's eos ids (tokenizer eos + generation_config eos_token_id)."""
        stop = tuple(sorted({int(t) for t in (*eos_token_ids, *getattr(params, "stop_token_ids", ()))}))
        min_tokens = int(getattr(params, "min_tokens", 0))
        return cls(
            temperature=float(params.temperature), top_k=max(int(params.top_k), 0), top_p=float(params.top_p),
            min_p=float(params.min_p), repetition_penalty=float(getattr(params, "repetition_penalty", 1.0)),
            presence_penalty=float(getattr(params, "presence_penalty", 0.0)),
            frequency_penalty=float(getattr(params, "frequency_penalty", 0.0)),
            min_tokens=min_tokens, stop_token_ids=stop if min_tokens > 0 else (),
        )


@functools.cache
def model_eos_ids(model_path: str) -> tuple[int, ...]:
    """The eos ids vLLM adds to a request's stop ids (what min_tokens masks): the tokenizer's eos and
    generation_config.json's eos_token_id(s), plus config.json's; read from the HF folder's JSON files."""
    folder = Path(model_path)
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        eos = _read_json(folder / name).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    tok = _read_json(folder / "tokenizer_config.json")
    eos_token = tok.get("eos_token")
    eos_token = eos_token.get("content") if isinstance(eos_token, dict) else eos_token
    ids.update(int(i) for i, t in (tok.get("added_tokens_decoder") or {}).items() if t.get("content") == eos_token)
    return tuple(sorted(ids))


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}
