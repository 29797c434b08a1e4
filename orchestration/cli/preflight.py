"""`python -m orchestration.cli.preflight --config CONFIG [key=value ...]`: will the learner fit its chips?

Compiles the learner's step (logprobs, gradient accumulation over one micro-batch, optimizer update) for the
config's `learner.topology` on this machine, from the model's config.json only (no weights, no TPU), and prints
per chip: frozen weights, LoRA + optimizer state, temporaries, the total against the chip's HBM, XLA's FLOPs,
an estimated step time and an MFU estimate. Exit 0 with a last line `preflight: fits ...` when the total leaves
>= 10% of HBM free; exit 2 with one line naming the setting to change when it does not, also when XLA's TPU compiler
itself refuses the step for lack of HBM (its needed and available figures per chip). It first states the parts' split
it checked at load (hosts, chips, tensor parallelism against the model's heads: orchestration/config/parallelism.py).

Sequence length: the longest prompt (`--prompt-tokens`, default 256, at most max_model_len - max_tokens) plus
rollout.sampling.max_tokens, rounded up to learner.seq_bucket, as the Learner pads a batch.
TPU topologies need libtpu importable: in the learner env on a TPU VM, or here from the sidecar folder that
setup installs ($AHA_LIBTPU, default $AHA_CACHE/envs/libtpu); see `use_libtpu`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from orchestration.config.schema import RunConfig
from orchestration.config.errors import ConfigError, error_report
from orchestration.config.files import load_config
from common.model_cache import cache_dir

REPO = Path(__file__).resolve().parents[2]
SETUP_HINT = "bash scripts/setup_envs.sh"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestration.cli.preflight", description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, help="YAML config (see configs/)")
    p.add_argument("--model-config", type=Path, help="config.json of the model (default: model.path's, else "
                                                     "configs/models/<model.path's name>/config.json)")
    p.add_argument("--prompt-tokens", type=int,
                   help="longest prompt in tokens (default 256; the shipped tasks' prompts are shorter)")
    p.add_argument("--compare-dense", action="store_true",
                   help="also compile with learner.logprob_chunk=0 (dense logprobs) and show both")
    p.add_argument("--probe-layers", action="store_true",
                   help="compile 2- and 3-layer models and extrapolate to the real layer count (on TPU 1.5-2 min here "
                        "against 2-2.7 for the whole model, a gap that grows with depth; checked against "
                        "whole-model compiles in the tests)")
    p.add_argument("--recompile", action="store_true",
                   help="compile every step piece, even one whose figures a preflight before kept (they are kept "
                        "under a hash of the program, the devices, the compiler's build and its flags)")
    p.add_argument("--refresh-figures", action="store_true",
                   help="remake the shipped TPU figures (configs/preflight_figures/) of every shipped config, probe "
                        "and whole model, compiling only the pieces they lack, and remove the entries no shipped "
                        "config uses; --config is then not needed (see orchestration/cli/preflight_figures.py)")
    p.add_argument("--jobs", type=int, default=2, help="with --refresh-figures: preflights run at once")
    p.add_argument("--used-keys", type=Path, help=argparse.SUPPRESS)  # a refresh's child: the shipped keys it used
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. learner.remat=true")
    return p.parse_args(argv)


def model_config_path(cfg: RunConfig, given: Path | None) -> Path:
    """The model's config.json: given, in model.path, or shipped under configs/models/<name>/."""
    path = given if given else cfg.model.config_json
    if path is not None and path.exists():
        return path
    looked = given or f"{cfg.model.resolved_path} and {REPO / 'configs' / 'models' / Path(cfg.model.path).name}"
    raise ConfigError(f"no config.json for model.path {cfg.model.path}: looked in {looked}; "
                      "pass --model-config or add configs/models/<name>/config.json")


def libtpu_sidecar() -> Path:
    """Where setup installs libtpu for compiling without a TPU: $AHA_LIBTPU, default $AHA_CACHE/envs/libtpu."""
    return Path(os.environ.get("AHA_LIBTPU", cache_dir() / "envs" / "libtpu")).expanduser()


def use_libtpu(topology: str | None) -> None:
    """Make libtpu importable for a TPU topology; raise a one-line error naming setup when it is missing."""
    if topology in (None, "cpu") or importlib.util.find_spec("libtpu") is not None:
        return
    sidecar = libtpu_sidecar()
    if not (sidecar / "libtpu").is_dir():
        raise ConfigError(f"compiling for learner.topology {topology} needs libtpu, not found in this env nor in "
                          f"{sidecar}; run `{SETUP_HINT}` (it installs it there) or set AHA_LIBTPU=DIR")
    sys.path.insert(0, str(sidecar))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.refresh_figures and args.config is None:
        from orchestration.cli.preflight_figures import refresh

        return refresh(args.jobs)
    if args.config is None:
        print("preflight: --config CONFIG is needed (or --refresh-figures)", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
        hf_path = model_config_path(cfg, args.model_config)
        use_libtpu(cfg.learner.topology)
    except ConfigError as err:
        print(error_report(err, "preflight"), file=sys.stderr)
        return 2
    # Compile only: never open an accelerator (a TPU VM's chips may be in use by the run itself).
    os.environ["JAX_PLATFORMS"] = "cpu"
    # libtpu takes /tmp/libtpu_lockfile, so a second preflight, or one beside a TPU run, would abort; we open no TPU.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # What a step's compile yields is kept by preflight itself (learner/compiled_figures.py), for CPU and TPU alike;
    # JAX's executable cache would only make --recompile read a CPU step back instead of compiling it (and on TPU
    # it cannot read back without a TPU client: a warning per compile).
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    from learner.compiled_figures import FigureStore
    from orchestration.cli.preflight_report import run

    store = FigureStore(shipped=None) if args.recompile else \
        FigureStore(kept=cache_dir() / "preflight" / "figures", refresh=args.refresh_figures)
    as_shipped = (args.config.resolve().parent == REPO / "configs" and not args.overrides
                  and args.prompt_tokens is None and args.model_config is None)
    code = run(cfg, hf_path, args.prompt_tokens, args.compare_dense, args.probe_layers, store, as_shipped)
    if args.used_keys is not None:
        args.used_keys.write_text("".join(f"{key}\n" for key in sorted(store.used)))
    return code


if __name__ == "__main__":
    sys.exit(main())
