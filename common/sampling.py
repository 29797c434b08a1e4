"""What goes into the engine and what comes back: `SamplingParams` and `Completion`.

`SamplingParams` is the one typed object for every sampling knob the engine has. Each field has our default and
`to_payload()` sends all of them explicitly, so nothing is silently inherited from the model's
`generation_config.json` (vLLM applies it to any field a request leaves out). Mistakes are caught here, before a
request is sent, with a one-line message that says what to change (e.g. `n > 1` at temperature 0, which the server
would answer with a 400 in the middle of a training step).

Only pydantic and the standard library are imported: this module runs in the driver, the actor and the learner env.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, model_validator

from common.strict import Strict

# Keys the client owns in a request; `extra` must not override them or responses stop matching what we parse.
_CLIENT_KEYS = frozenset({"model", "prompt", "stream", "return_token_ids", "cache_salt", "echo"})


# The value at which each sampling transform is a no-op. These are the fields whose being ignored changes the
# distribution; n, max_tokens, stop, logprobs and the other fields are honoured by every engine (rollout/capabilities.py).
OFF: dict[str, float | int | None] = {
    "temperature": 1.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_tokens": 0,
}
# The transforms whose value at a position depends on the tokens before it (penalties count the prompt and the
# earlier completion; min_tokens counts the completion so far): reproducing them needs each row's token history.
PENALTIES = frozenset({"repetition_penalty", "presence_penalty", "frequency_penalty", "min_tokens"})
ALL = frozenset(OFF)


def active(params: Any) -> list[str]:
    """Sampling transforms `params` switches on (fields away from their OFF value)."""
    return [name for name, off in OFF.items() if getattr(params, name) != off]


def needs_history(params: Any) -> bool:
    """Whether sampling under `params` (SamplingParams, or anything with its field names) depends on token history:
    a penalty or min_tokens is on. The one statement of the rule: the run config, the learner's transform and its
    dense reference all ask here."""
    return any(name in PENALTIES for name in active(params))


class SamplingParams(Strict):
    """Every sampling knob of the engine, with our defaults; frozen and validated on construction."""

    temperature: float = Field(1.0, ge=0.0)
    """Softmax temperature; 0 means greedy."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling: keep the smallest set of tokens whose probability mass reaches top_p (1.0 = off)."""
    top_k: int = -1
    """Keep only the k most likely tokens (-1 = off)."""
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    """Drop tokens whose probability is below min_p times the most likely token's (0 = off)."""
    repetition_penalty: float = Field(1.0, gt=0.0)
    """Multiplicative penalty on tokens already in the prompt or completion (1.0 = off, > 1 discourages)."""
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    """Additive penalty on tokens already generated, once per token (0 = off)."""
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    """Additive penalty on tokens already generated, proportional to their count (0 = off)."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end a completion; the stop string itself is not part of the returned text."""
    stop_token_ids: list[int] = Field(default_factory=list)
    """Token ids that end a completion (in addition to the model's eos unless ignore_eos)."""
    seed: int | None = None
    """Per-request seed; reproduces a request sent alone (not one batched with other concurrent requests)."""
    n: int = Field(1, ge=1)
    """Samples per prompt (the GRPO group size)."""
    max_tokens: int = Field(256, ge=1)
    """Most tokens to generate per sample."""
    min_tokens: int = Field(0, ge=0)
    """Fewest tokens to generate before eos or stop_token_ids may end a sample."""
    logprobs: int = Field(0, ge=0, le=20)
    """Top alternatives to return per token; the sampled token's logprob is always returned (0 = only it)."""
    ignore_eos: bool = False
    """Keep generating past eos until max_tokens (benchmarks)."""
    skip_special_tokens: bool = True
    """Drop special tokens from the returned text (token ids are always complete)."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Engine-specific request fields passed through as-is, merged last into the payload."""

    @model_validator(mode="after")
    def _check(self) -> SamplingParams:
        if self.n > 1 and self.temperature == 0:
            raise ValueError(f"sampling.n ({self.n}) > 1 with temperature 0 gives n identical greedy samples "
                             "(and a 400 from vLLM); set temperature > 0 or n = 1")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"sampling.top_k ({self.top_k}) must be -1 (off) or >= 1")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"sampling.min_tokens ({self.min_tokens}) exceeds max_tokens ({self.max_tokens}); "
                             "lower min_tokens or raise max_tokens")
        if any(s == "" for s in self.stop):
            raise ValueError("sampling.stop contains an empty string, which would stop at once; remove it")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"sampling.stop_token_ids ({self.stop_token_ids}) must be token ids >= 0")
        typed = set(type(self).model_fields) - {"extra"}
        if clash := sorted(typed & set(self.extra)):
            raise ValueError(f"sampling.extra sets {clash}, which are typed fields; set sampling.{clash[0]} instead")
        if clash := sorted(_CLIENT_KEYS & set(self.extra)):
            raise ValueError(f"sampling.extra sets {clash}, which the rollout client owns; remove them from extra")
        return self

    def to_payload(self) -> dict[str, Any]:
        """Request fields for an OpenAI-style completions call: every field explicitly, `extra` merged last."""
        payload = self.model_dump(exclude={"extra"})
        payload.update(self.extra)
        return payload


@dataclass
class EpisodeTrace:
    """How a multi-turn episode went (tasks/episodes.py), for metrics and samples.jsonl; the learner needs none of it."""

    turns: int = 0
    """Model turns played."""
    end: str = ""
    """Why it ended: done (the environment said so), max_turns, max_tokens (the episode's token budget), timeout or
    error (the environment's). A turn cut by max_tokens still goes to the environment (finish_reason "length")."""
    transcript: list[dict[str, Any]] = field(default_factory=list)
    """The messages after the opening, model turns included, as text."""
    info: dict[str, float] = field(default_factory=dict)
    """The environment's counts (Reply.info), summed over the episode."""
    error: str | None = None
    """The environment's failure, one line."""


@dataclass
class Completion:
    """One sample for one prompt, as the learner needs it: a single completion, or a whole multi-turn episode (the
    same type: its tokens interleave the model's turns with the environment's replies, told apart by `mask`)."""

    token_ids: list[int]
    """Sampled token ids after the prompt, exactly as sampled; a final eos/stop token is included. An episode's
    span every token after its opening, model turns and environment replies."""
    logprobs: list[float]
    """Engine logprob of each token (same length as token_ids; 0.0 at an environment's tokens)."""
    text: str
    """Detokenised completion (stop strings removed; special tokens per skip_special_tokens); an episode's last
    model turn (what the rewards score)."""
    finish_reason: str
    """"stop" (eos, stop string or stop token) or "length" (max_tokens)."""
    adapter: str | None = None
    """The served name of the LoRA adapter that produced it (common/lora_adapter.py); None = the base model."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Engine detail not needed by the learner (e.g. stop_reason, top logprobs)."""
    mask: list[int] | None = None
    """Per token: 1 = sampled by the model, 0 = appended by an environment (no loss, no ratio); None: every token
    is the model's."""
    env_reward: float = 0.0
    """The environment's reward for the episode (added to the reward terms' total); 0 for a single completion."""
    episode: EpisodeTrace | None = None
    """How the episode went; None for a single completion."""

    @property
    def model_tokens(self) -> int:
        """Tokens the model sampled (an environment's tokens are not generated)."""
        return len(self.token_ids) if self.mask is None else sum(self.mask)
