"""`Strict`: the base of every config model (rollout, learner, rewards, tasks and the run tree in orchestration).

Unknown keys are errors (a typo never passes silently), a config is frozen (no part rewrites another's settings),
and each field's docstring becomes its description (the generated reference, docs/config.md, reads them). It is a
on the ground floor because every part's config derives from it and no part imports another part or orchestration.
Only pydantic is imported: the engine envs import it too (rollout/ runs there).
"""

from pydantic import BaseModel, ConfigDict


STRICT = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
"""The one strict config: pydantic dataclasses (the reward functions with parameters) take it as `config=`."""


class Strict(BaseModel):
    model_config = STRICT
