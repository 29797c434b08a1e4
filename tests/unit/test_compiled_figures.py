"""learner/compiled_figures.py: a compiled piece's analyses are kept under its program, read back instead of
compiling again, and any change to the program compiles again; the shipped figures are read first and a piece they
lack is named. Real JAX compiles on CPU."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp

from learner.compiled_figures import MEMORY_FIELDS, SHIPPED, Figures, FigureStore


class CountingLowered:
    """A real `jax.stages.Lowered` that counts its compiles."""

    def __init__(self, lowered):
        self.lowered, self.compiles = lowered, 0

    def as_text(self) -> str:
        return self.lowered.as_text()

    def compile(self):
        self.compiles += 1
        return self.lowered.compile()


def compile_figures(lowered, devices: list, folder) -> Figures:
    """A store of one machine folder (None: keep nothing), no shipped figures."""
    return FigureStore(shipped=None, kept=folder).figures(lowered, devices, "")


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


def test_shipped_figures_are_read_first_and_a_miss_is_named(tmp_path):
    """A piece on a shipped platform is read from the shipped folder; one it lacks is compiled, kept on the machine
    and named in `misses` (what preflight prints for a stale shipped config); a refresh writes it to the shipped
    folder and records the keys it used. CPU stands in for the TPU platform here (`shipped_platforms`)."""
    devices = jax.devices("cpu")
    shipped, kept = tmp_path / "shipped", tmp_path / "kept"
    store = FigureStore(shipped=shipped, kept=kept, shipped_platforms=("cpu",))
    piece = lowered(64)
    figures = store.figures(piece, devices, "2 layers: accumulate")
    assert piece.compiles == 1 and store.misses == ["2 layers: accumulate"] and not store.used
    assert not shipped.exists() and len(list(kept.glob("*.json"))) == 1  # a plain preflight never writes shipped

    refresh = FigureStore(shipped=shipped, kept=kept, refresh=True, shipped_platforms=("cpu",))
    again = lowered(64)
    assert refresh.figures(again, devices, "2 layers: accumulate") == figures and again.compiles == 0  # from kept
    [entry] = shipped.glob("*.json")
    assert refresh.used == {entry.stem} and json.loads(entry.read_text())["piece"] == "2 layers: accumulate"

    fresh = FigureStore(shipped=shipped, kept=tmp_path / "empty", shipped_platforms=("cpu",))  # a new machine
    third = lowered(64)
    assert fresh.figures(third, devices, "x") == figures and third.compiles == 0 and not fresh.misses
    changed = lowered(96)  # the step changed: its program is not shipped
    fresh.figures(changed, devices, "3 layers: apply")
    assert changed.compiles == 1 and fresh.misses == ["3 layers: apply"]


def test_other_platforms_never_read_or_write_the_shipped_figures(tmp_path):
    """Only TPU pieces ship (a CPU compile is for the host it runs on): a CPU piece goes to the machine's folder."""
    store = FigureStore(shipped=tmp_path / "shipped", kept=tmp_path / "kept", refresh=True)
    store.figures(lowered(64), jax.devices("cpu"), "cpu piece")
    assert not (tmp_path / "shipped").exists() and not store.misses and len(list((tmp_path / "kept").glob("*"))) == 1


def test_the_shipped_figures_are_whole_entries():
    """Every committed entry parses and names its piece (a refresh writes them; a hand edit that breaks one would
    silently make a fresh machine compile it)."""
    entries = sorted(SHIPPED.glob("*.json"))
    assert entries, f"no shipped figures in {SHIPPED}: run `aha preflight --refresh-figures`"
    for path in entries:
        entry = json.loads(path.read_text())
        assert set(entry) == {"piece", "memory", "cost"} and set(entry["memory"]) == set(MEMORY_FIELDS), path
        assert len(path.stem) == 64 and entry["piece"], path
