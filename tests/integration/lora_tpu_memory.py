"""Compile the LoRA gradient through one sharded SwiGLU MLP for a TPU topology, with Qwix's own update and with
learner/lora_delta.py's, and print each compile's per-chip temporaries and FLOPs as JSON (no TPU needed: libtpu's
compiler runs here, found as preflight finds it). Run as a subprocess by tests/integration/test_lora_delta_tpu.py.

    python tests/integration/lora_tpu_memory.py [TOPOLOGY]
"""

from __future__ import annotations

import json
import os
import sys

from orchestration.cli.preflight import use_libtpu

# Qwen2.5-1.5B's MLP at the TPU config's micro-batch (16 x 1280 tokens), LoRA r16, bf16 weights, fsdp over 4 chips.
BATCH, TIME, DIM, FFN, RANK = 16, 1280, 1536, 8960, 16


def main() -> None:
    topology = sys.argv[1] if len(sys.argv) > 1 else "v5e:2x2"
    # As preflight compiles: libtpu from the sidecar, no accelerator opened, beside any other libtpu user.
    use_libtpu(topology)
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from learner import lora_delta

    devices = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices
    mesh = Mesh(np.array(devices).reshape(len(devices), 1), ("fsdp", "tp"))

    def spec(shape, dtype, *axes):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec(*axes)))

    x = spec((BATCH, TIME, DIM), jnp.bfloat16, "fsdp", None, None)
    shapes = {"gate": (DIM, FFN), "up": (DIM, FFN), "down": (FFN, DIM)}
    weights = {n: spec(s, jnp.bfloat16, "fsdp", "tp") for n, s in shapes.items()}
    lora = {n: (spec((s[0], RANK), jnp.float32, "fsdp", None), spec((RANK, s[1]), jnp.float32))
            for n, s in shapes.items()}

    def compiled(delta_fn) -> dict:
        def proj(name, h, lora, weights):
            a, b = lora[name]
            update = delta_fn(h, a, b, (2,), (), a.shape[:1], (), b.shape[1:], RANK)
            return jnp.einsum("btd,df->btf", h, weights[name]) + update * 2.0

        def loss(lora, x, weights):
            h = jax.nn.silu(proj("gate", x, lora, weights)) * proj("up", x, lora, weights)
            return jnp.sum(proj("down", h.astype(jnp.bfloat16), lora, weights).astype(jnp.float32))

        with jax.set_mesh(mesh):
            exe = jax.jit(jax.grad(loss)).lower(lora, x, weights).compile()
        return {"temp_bytes": exe.memory_analysis().temp_size_in_bytes, "flops": exe.cost_analysis()["flops"]}

    print(json.dumps({"qwix": compiled(lora_delta._QWIX_DELTA), "ours": compiled(lora_delta.lora_delta)}))


if __name__ == "__main__":
    main()
