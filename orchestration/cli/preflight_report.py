"""Preflight's compile and report (imported only after preflight.py has set up JAX for compiling)."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

from learner.compiled_figures import FigureStore
from orchestration.config.schema import RunConfig
from orchestration.cluster.tpu_plan import describe as tpu_plan
from orchestration.config.parallelism import report as parts_report

HEADROOM = 0.10  # HBM that must stay free: runtime, fragmentation, the compiler's own misestimates
GIB = 1 << 30
PROBE_LAYERS = (2, 3)
"""Layer counts `--probe-layers` compiles and extrapolates from (see _probed_figures)."""
PROMPT_TOKENS = 256
"""Default longest prompt: the shipped tasks' chat prompts (system + Countdown or math question) stay under it."""
# XLA's TPU compiler refusing a program that cannot fit (libtpu 0.0.50.1), e.g. "RESOURCE_EXHAUSTED: E1000:
# CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO temporaries (135.54G) exceeds
# available HBM (15.75G)". Its sizes are binary (tsl HumanReadableNumBytes: G = GiB).
HBM_OOM = re.compile(r"CompileTimeHbmOom.*?required for (?P<what>[^(]+?) \((?P<need>[\d.]+)(?P<nu>[KMGT])\)"
                     r".*?available HBM \((?P<have>[\d.]+)(?P<hu>[KMGT])\)", re.S)
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class CompileOom(RuntimeError):
    """XLA's TPU compiler refused a step piece for lack of HBM: what it needed and had per chip, and the geometry."""

    def __init__(self, what: str, need: int, have: int, geo, data_parallel: int):
        super().__init__(f"{what} need {need / GIB:.2f} GiB per chip, {have / GIB:.2f} available")
        self.what, self.need, self.have, self.geo, self.data_parallel = what, need, have, geo, data_parallel


def compile_oom(message: str, geo, data_parallel: int) -> CompileOom | None:
    """The CompileOom in an XLA error message, or None for any other error."""
    m = HBM_OOM.search(message)
    if m is None:
        return None
    size = lambda value, unit: int(float(value) * UNITS[unit])
    return CompileOom(" ".join(m["what"].split()), size(m["need"], m["nu"]), size(m["have"], m["hu"]), geo,
                      data_parallel)


def _figures(cfg: RunConfig, learner_cfg, hf: dict, max_sequence: int, store: FigureStore):
    """The learner's step for `learner_cfg`, its chunk loop counted in full; (mesh, geometry, pieces, sizes, chip).

    The loop's count is measured at the probe's shallower depth, so a whole-model check after `--probe-layers` (or
    before it) compiles its correction once for both: the same programs, kept under the same keys. A 1-layer model
    measures it as well, in two more TPU compiles (Gemma 3 1B on v5e:2x4: 38 and 41 CPU-s, docs/benchmarks.md)."""
    mesh, geo, pieces, sizes, chip = _compiled_figures(cfg, learner_cfg, hf, max_sequence, store)
    small = with_layers(hf, min(PROBE_LAYERS[0], hf["num_hidden_layers"]))
    return mesh, geo, _with_whole_chunk_loop(cfg, learner_cfg, small, max_sequence, geo, pieces, store=store), sizes, chip


def _with_whole_chunk_loop(cfg: RunConfig, learner_cfg, small: dict, max_sequence: int, geo, pieces,
                           small_pieces=None, store: FigureStore | None = None):
    """`pieces` with the chunked logprob loop's FLOPs and bytes counted for every chunk, not once.

    XLA's cost analysis counts a while loop's body once (Qwen2.5-1.5B on v5e:2x2, `--probe-layers` at c46c81c,
    before this correction: 46.5 TFLOP per accumulate call with 8 chunks of 128 completion positions, 49.9 with
    `learner.logprob_chunk=1024`, one chunk). The body (LM head and transform over
    one chunk) grows linearly with its positions and does not depend on the decoder depth, so a shallow model
    (`small`, compiled at the config's chunk: `small_pieces`, or compiled here) measures it: the whole window in one
    chunk (W positions) against chunks of c gives a position's share, and each piece gets (n - 1) x c more."""
    from learner.logprobs import balanced_chunks

    configured = getattr(learner_cfg, "logprob_chunk", 0)
    if not configured:
        return pieces
    n, c = balanced_chunks(geo.window, configured)
    if n <= 1:
        return pieces
    at = lambda chunk: _compiled_figures(cfg, learner_cfg.model_copy(update={"logprob_chunk": chunk}), small,
                                         max_sequence, store)[2]
    chunked, whole = small_pieces or at(configured), at(geo.window)
    share = (n - 1) * c / (geo.window - c)
    extra = {a.name: (b.flops - a.flops, b.bytes_accessed - a.bytes_accessed) for a, b in zip(chunked, whole,
                                                                                                strict=True)}
    return [dataclasses.replace(p, flops=p.flops + share * extra[p.name][0],
                                bytes_accessed=p.bytes_accessed + share * extra[p.name][1]) for p in pieces]


def _compiled_figures(cfg: RunConfig, learner_cfg, hf: dict, max_sequence: int, store: FigureStore):
    """Compile the learner's step for `learner_cfg` (a piece's figures read from `store` if compiled before); returns
    (mesh, geometry, pieces, state sizes, chip)."""
    import jax

    from learner import aot
    from learner.hbm import chip_for, per_device
    from learner.sampling import SamplingTransform
    from learner.mesh import learner_mesh

    devices = aot.topology_devices(learner_cfg.topology)
    mesh = learner_mesh(learner_cfg.devices, learner_cfg.mesh, devices)
    parts, lora, _ = aot.abstract_model(hf, learner_cfg, mesh)
    batch = cfg.train.prompts_per_step * cfg.rollout.sampling.n
    geo = aot.geometry(learner_cfg, batch, max_sequence, cfg.rollout.sampling.max_tokens, mesh.shape["fsdp"])
    s = cfg.rollout.sampling
    try:
        compiled, state = aot.compile_step(learner_cfg, parts, lora, mesh, geo, SamplingTransform.of(s, _eos_ids(hf)),
                                           store, f"{hf['num_hidden_layers']} layers, logprob_chunk "
                                           f"{getattr(learner_cfg, 'logprob_chunk', 0)}:")
    except jax.errors.JaxRuntimeError as err:  # the TPU compiler itself refuses what cannot fit its chips
        if (oom := compile_oom(str(err), geo, mesh.shape["fsdp"])) is None:
            raise
        raise oom from None
    sizes = {k: aot.bytes_per_device(v) for k, v in state.items()}
    return mesh, geo, aot.analyse(compiled, state, geo), sizes, per_device(chip_for(learner_cfg.topology), devices)


def with_layers(hf: dict, layers: int) -> dict:
    """config.json cut to its first `layers` decoder layers (a per-layer list such as layer_types cut alike)."""
    out = dict(hf, num_hidden_layers=layers)
    if isinstance(hf.get("layer_types"), list):
        out["layer_types"] = hf["layer_types"][:layers]
    return out


def _probed_figures(cfg: RunConfig, learner_cfg, hf: dict, max_sequence: int, store: FigureStore):
    """`_figures` for the whole model from 2- and 3-layer compiles: every per-device figure (state sizes, each
    piece's live and temp bytes, FLOPs, bytes accessed) taken as a + b * layers, which is how a stack of identical
    decoder layers grows (weights and optimizer state exactly; activations kept for the backward pass and XLA's
    temporaries as checked against whole-model compiles by tests/integration/test_preflight.py). Not 1 layer: on
    TPU a 1-layer program schedules its temporaries unlike any deeper one (Qwen2.5-1.5B on v5e:2x2, logprobs temp
    0.75 GiB at 1 layer, 1.74 at 2, 3 and 4), and a line through it extrapolated to 28.6 GiB. Seconds instead of the
    minutes that a whole model's compile takes."""
    layers = hf["num_hidden_layers"]
    lo, hi = PROBE_LAYERS
    (mesh, geo, p1, s1, chip), (_, _, p2, s2, _) = (
        _compiled_figures(cfg, learner_cfg, with_layers(hf, n), max_sequence, store) for n in PROBE_LAYERS)
    line = lambda a, b: a + (layers - lo) * (b - a) / (hi - lo)
    fields = ("live_bytes", "temp_bytes", "flops", "bytes_accessed", "optimal_seconds")
    pieces = [dataclasses.replace(a, **{f: type(getattr(a, f))(line(getattr(a, f), getattr(b, f))) for f in fields})
              for a, b in zip(p1, p2, strict=True)]
    pieces = _with_whole_chunk_loop(cfg, learner_cfg, with_layers(hf, lo), max_sequence, geo, pieces, p1, store)
    return mesh, geo, pieces, {k: int(line(s1[k], s2[k])) for k in s1}, chip


def _eos_ids(hf: dict) -> tuple[int, ...]:
    """config.json's eos id(s): what min_tokens masks (no tokenizer files ship with the architecture facts)."""
    eos = hf.get("eos_token_id")
    return (eos,) if isinstance(eos, int) else tuple(eos or ())


def _seconds(piece, chip) -> float:
    """Roofline bound max(flops / peak, bytes / bandwidth) from XLA's counts; 0 when the chip has no figures.

    Not XLA's `optimal_seconds`: for the accumulate piece it came back negative (-1121 s, v5e, Qwen2.5-1.5B)."""
    if chip.peak_flops <= 0:
        return 0.0
    return max(piece.flops / chip.peak_flops, piece.bytes_accessed / chip.hbm_bandwidth)


def _report(label: str, mesh, geo, pieces, sizes, chip) -> dict:
    """Print the per-chip table for one variant; returns its headline figures."""
    running = [p for p in pieces if p.calls > 0]
    peak = max(running, key=lambda p: p.live_bytes)
    resident = sizes["frozen"] + sizes["lora"] + sizes["opt_state"]
    total = peak.live_bytes
    print(f"[{label}] per chip ({chip.name}, {chip.hbm_bytes / GIB:.2f} GiB):")
    print(f"  frozen weights        {sizes['frozen'] / GIB:8.3f} GiB")
    print(f"  LoRA + optimizer      {(sizes['lora'] + sizes['opt_state']) / GIB:8.3f} GiB"
          f"  (LoRA {sizes['lora'] / GIB:.3f}, optimizer {sizes['opt_state'] / GIB:.3f}; "
          f"+ gradient accumulator {sizes['grad_acc'] / GIB:.3f} during a mini-batch)")
    print(f"  temporaries           {(total - resident) / GIB:8.3f} GiB  (peak in '{peak.name}': XLA temp "
          f"{peak.temp_bytes / GIB:.3f} + its inputs/outputs)")
    print(f"  total                 {total / GIB:8.3f} GiB of {chip.hbm_bytes / GIB:.2f} "
          f"({100 * total / chip.hbm_bytes:.0f}% used, {100 * (1 - total / chip.hbm_bytes):.0f}% free)")
    step_s = sum(p.calls * _seconds(p, chip) for p in pieces)
    flops = sum(p.calls * p.flops for p in pieces)
    print(f"  {'piece':<11}{'calls/step':>11}{'GFLOP/call':>12}{'est s/call':>12}{'live GiB':>10}")
    for p in pieces:
        print(f"  {p.name:<11}{p.calls:>11}{p.flops / 1e9:>12.1f}{_seconds(p, chip):>12.4f}{p.live_bytes / GIB:>10.3f}")
    if not geo.off_policy:
        print(f"  {'logprobs':<11}{0:>11}  (the old-logprob pass runs only off-policy: not compiled)")
    mfu = flops / (step_s * chip.peak_flops) if step_s > 0 and chip.peak_flops > 0 else None
    print(f"  step: XLA FLOPs {flops:.3e} per chip, est. {step_s:.2f} s "
          + (f"(roofline per piece: max(FLOPs / peak, bytes / HBM bandwidth)), MFU estimate {100 * mfu:.0f}%"
             if mfu else "(no cost model for CPU)"))
    return {"total": total, "hbm": chip.hbm_bytes, "data_parallel": mesh.shape["fsdp"], "step_s": step_s, "mfu": mfu,
            "peak": peak, "geo": geo, "sizes": sizes}


def _advice(cfg: RunConfig, fig: dict) -> str:
    """One line: which setting to change, judged from where the memory goes."""
    budget = (1 - HEADROOM) * fig["hbm"]
    lc, geo = cfg.learner, fig["geo"]
    resident = fig["sizes"]["frozen"] + fig["sizes"]["lora"] + fig["sizes"]["opt_state"] + fig["sizes"]["grad_acc"]
    need = f"needs {fig['total'] / GIB:.2f} GiB per chip, over {budget / GIB:.2f} (90% of {fig['hbm'] / GIB:.2f})"
    if resident > 0.5 * budget:
        return (f"preflight: does not fit: {need}, {resident / GIB:.2f} of it weights and optimizer state; "
                "shard over more chips: learner.mesh (and a larger learner.topology)")
    if not lc.remat:
        return f"preflight: does not fit: {need}; set learner.remat=true (recompute layers in the backward pass)"
    per_row = (fig["total"] - resident) / geo.micro
    dp = fig["data_parallel"]  # the Learner rounds micro-batches to a multiple of the data-parallel size
    fit = int((budget - resident) // per_row) // dp * dp if per_row > 0 else geo.micro
    if fit >= dp and geo.micro > dp:
        return (f"preflight: does not fit: {need}; lower learner.grpo.micro_batch_size from {geo.micro} to about "
                f"{fit} (temporaries scale with it)")
    return (f"preflight: does not fit: {need} with {geo.micro} sequence(s) of {geo.length} tokens per micro-batch; "
            "lower rollout.sampling.max_tokens (and rollout.backend.max_model_len)")


def _oom_advice(cfg: RunConfig, oom: CompileOom, probe_layers: bool) -> str:
    """The verdict line for a step the TPU compiler refused: its figures and the setting to change."""
    geo, dp = oom.geo, oom.data_parallel
    where = (f" (in the {PROBE_LAYERS[0]}-layer probe compile: the whole model needs more)" if probe_layers else "")
    head = f"preflight: does not fit: XLA's TPU compiler ran out of HBM: {oom}{where}"
    fit = int(geo.micro * (1 - HEADROOM) * oom.have / oom.need) // dp * dp
    if fit >= dp and geo.micro > dp:
        given = cfg.learner.grpo.micro_batch_size
        now = f"{given}" if given == geo.micro else f"{given}, i.e. {geo.micro} sequences per micro-batch"
        return (f"{head}; lower learner.grpo.micro_batch_size ({now}) to at most {fit} (temporaries scale with "
                "it)")
    if not cfg.learner.remat:
        return f"{head}; set learner.remat=true (recompute layers in the backward pass)"
    return (f"{head} with {geo.micro} sequence(s) of {geo.length} tokens per micro-batch; lower "
            "rollout.sampling.max_tokens (and rollout.backend.max_model_len), or shard over more chips "
            "(learner.mesh, learner.topology)")


def run(cfg: RunConfig, hf_path: Path, prompt_tokens: int | None, compare_dense: bool, probe_layers: bool = False,
        store: FigureStore | None = None, shipped_config: bool = False) -> int:
    """Preflight's report; `store`: where each compile's figures are read and kept (learner/compiled_figures.py),
    None compiles every piece; `shipped_config`: a shipped config as shipped, whose TPU pieces the shipped figures
    should all hold (a line names those they lack)."""
    store = store or FigureStore(shipped=None)
    hf = json.loads(hf_path.read_text())
    s, backend = cfg.rollout.sampling, cfg.rollout.backend
    prompt_tokens = min(prompt_tokens or PROMPT_TOKENS, backend.max_model_len - s.max_tokens)
    max_sequence = prompt_tokens + s.max_tokens
    variants = [("as configured", cfg.learner)]
    if compare_dense and "logprob_chunk" in type(cfg.learner).model_fields:
        variants.insert(0, ("dense logprobs", cfg.learner.model_copy(update={"logprob_chunk": 0})))
    elif compare_dense:
        print("preflight: --compare-dense: this learner has no learner.logprob_chunk (logprobs are dense): one variant")
    print(f"preflight: learner on {cfg.learner.topology}, model {hf_path.parent.name} ({hf.get('model_type')}) "
          f"from {hf_path}; sequences <= {prompt_tokens} prompt + {s.max_tokens} completion tokens"
          + (f"; {hf['num_hidden_layers']} layers extrapolated from {PROBE_LAYERS[0]}- and {PROBE_LAYERS[1]}-layer "
             "compiles" if probe_layers else ""))
    print(parts_report(cfg, hf))
    for line in tpu_plan(cfg):
        print(line)
    if store.kept is not None:
        print(f"preflight: a piece compiled before (the same program, devices, compiler and flags) is read from "
              f"{_shown(store.shipped)} or {store.kept}, not compiled again; --recompile compiles every piece")
    figures_of = _probed_figures if probe_layers else _figures
    figures = None
    for label, lc in variants:
        t0 = time.perf_counter()
        try:
            mesh, geo, pieces, sizes, chip = figures_of(cfg, lc, hf, max_sequence, store)
        except CompileOom as oom:
            print(_oom_advice(cfg, oom, probe_layers))
            return 2
        print(f"[{label}] mesh {dict(mesh.shape)}; step: {geo.rows} sequences x {geo.length} tokens, micro-batch "
              f"{geo.micro}, {geo.micro_steps} micro-steps, {geo.updates} update(s), "
              f"{'off' if geo.off_policy else 'on'}-policy; compiled in {time.perf_counter() - t0:.0f} s")
        figures = _report(label, mesh, geo, pieces, sizes, chip)
    if shipped_config and store.misses and not store.refresh:
        print(f"preflight: stale shipped figures: {len(store.misses)} TPU piece(s) of this shipped config are not in "
              f"{_shown(store.shipped)} and were compiled here ({'; '.join(store.misses)}): the learner step, "
              "jax/libtpu or the config changed since they were made; run `aha preflight --refresh-figures` and commit "
              "the folder")
    if figures["total"] > (1 - HEADROOM) * figures["hbm"]:
        print(_advice(cfg, figures))
        return 2
    step = f", est. step {figures['step_s']:.1f} s" if figures["step_s"] else ""
    mfu = f", MFU estimate {100 * figures['mfu']:.0f}%" if figures["mfu"] else ""
    print(f"preflight: fits: {figures['total'] / GIB:.2f} of {figures['hbm'] / GIB:.2f} GiB per chip "
          f"({100 * (1 - figures['total'] / figures['hbm']):.0f}% free){step}{mfu}")
    return 0


def _shown(folder: Path | None) -> str:
    """A folder as the user sees it: relative to the clone when inside it."""
    if folder is None:
        return "nowhere"
    root = Path(__file__).resolve().parents[2]
    return f"{folder.relative_to(root)}/" if folder.is_relative_to(root) else str(folder)
