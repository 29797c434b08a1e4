"""The ground floor: contracts every part may import, and nothing else.

Each module here imports only the standard library, pydantic and numpy, so the learner env, the driver and every
engine env (vLLM, SGLang-JAX, whose servers run our extensions) can import it. A fact two parts share lives here
once (the strict config base, upstream pins, run storage URIs, sampling parameters and completions, the PEFT
adapter format, the safe reading of model text), so no part imports another sideways.
"""
