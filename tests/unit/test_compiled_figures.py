"""learner/compiled_figures.py: a compiled piece's analyses are kept under its program, read back instead of
compiling again, and any change to the program compiles again. Real JAX compiles on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from learner.compiled_figures import Figures, compile_figures


class CountingLowered:
    """A real `jax.stages.Lowered` that counts its compiles."""

    def __init__(self, lowered):
        self.lowered, self.compiles = lowered, 0

    def as_text(self) -> str:
        return self.lowered.as_text()

    def compile(self):
        self.compiles += 1
        return self.lowered.compile()


def lowered(size: int) -> CountingLowered:
    x = jax.ShapeDtypeStruct((size, size), jnp.float32)
    return CountingLowered(jax.jit(lambda a: jnp.tanh(a @ a).sum()).lower(x))


def test_a_kept_program_is_read_back_not_compiled(tmp_path):
    devices = jax.devices("cpu")
    first = lowered(64)
    kept = compile_figures(first, devices, tmp_path)
    assert first.compiles == 1 and kept == Figures.of(first.lowered.compile())
    assert kept.cost_analysis()["flops"] > 2 * 64 ** 3 * 0.9
    again = lowered(64)
    assert compile_figures(again, devices, tmp_path) == kept and again.compiles == 0
    other = lowered(128)  # another program: compiled, kept beside the first
    assert compile_figures(other, devices, tmp_path) != kept and other.compiles == 1
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_compiler_flags_and_a_damaged_entry_compile_again(tmp_path, monkeypatch):
    devices = jax.devices("cpu")
    compile_figures(lowered(64), devices, tmp_path)
    [entry] = tmp_path.glob("*.json")
    entry.write_text('{"memory": {')  # cut short, as by a full disk
    damaged = lowered(64)
    assert compile_figures(damaged, devices, tmp_path).memory["temp_size_in_bytes"] >= 0 and damaged.compiles == 1
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_example_flag=true")
    flagged = lowered(64)
    compile_figures(flagged, devices, tmp_path)
    assert flagged.compiles == 1 and len(list(tmp_path.glob("*.json"))) == 2


def test_without_a_folder_every_piece_compiles(tmp_path):
    piece = lowered(64)
    compile_figures(piece, jax.devices("cpu"), None)
    compile_figures(piece, jax.devices("cpu"), None)
    assert piece.compiles == 2
