"""Self-distillation of an exit head: ``eesd distill`` and :func:`distill`.

The recipe of EESD (Liu et al. 2024): the frozen target answers our own prompts (greedy by
default); an exit head (one decoder layer initialised from a target layer, its own norm, the
target's LM head shared and frozen, or a subset of its rows) learns to match the target's
next-token distribution at every response position from the layer-N states captured on the way.
Each stage leaves its results in a work directory (data shards, a training checkpoint), so a run
that stops can be resumed; the head is written last, atomically, with the settings in its metadata.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from eesd_core.errors import ConfigError
from eesd_core.models import find_adapter
from eesd_early_exit.data import CaptureSettings, generate_shards, rank_vocab, read_shards
from eesd_early_exit.evaluate import decode_stats, format_report, teacher_forced
from eesd_early_exit.head import ExitHead
from eesd_early_exit.headfile import check_head, fingerprint, load_head, read_metadata, save_head
from eesd_early_exit.prompts import encode_prompts, load_prompts
from eesd_early_exit.settings import TrainSettings
from eesd_early_exit.train import train_head


@dataclass
class DistillConfig:
    """Everything a distillation depends on. ``work_dir`` defaults to ``<out>.work``."""

    exit_layer: int
    out: str | Path = "exit-head.safetensors"
    work_dir: str | Path | None = None
    max_new_tokens: int = 128
    top_k: int = 64
    temperatures: tuple[float, ...] = (0.0,)
    generate_batch: int = 16
    init_layer: int | None = None
    head_layers: int = 1
    mlp_width: int = 0
    head_storage: str = "float"  # or "int8": matrices as int8 with a scale per row (half the file)
    vocab_size_subset: int = 0
    top_input: bool = False
    capture_layers: tuple[int, ...] = ()
    train: TrainSettings = field(default_factory=TrainSettings)
    eval_prompts: int = 16
    eval_max_new_tokens: int = 128
    eval_k: int = 8
    resume: bool = False
    init_head: str | Path | None = None  # continue training this head file (it sets the head's shape)
    first_prompt: int = 0  # prompts before this index are skipped (e.g. those init_head learnt from)

    @property
    def work(self) -> Path:
        return Path(self.work_dir) if self.work_dir else Path(f"{self.out}.work")

    def capture(self, num_layers: int, temperature: float | None = None) -> CaptureSettings:
        """What one generation pass keeps; ``temperature`` defaults to the first of ``temperatures``."""
        extra = set(self.capture_layers) | ({num_layers} if self.top_input else set())
        return CaptureSettings(
            self.exit_layer,
            self.max_new_tokens,
            self.top_k,
            self.temperatures[0] if temperature is None else temperature,
            self.generate_batch,
            self.train.seed,
            tuple(sorted(extra - {self.exit_layer})),
        )

    def train_dirs(self) -> list[tuple[float, Path]]:
        """One data directory per response temperature: ``train`` for the first, ``train-tT`` after."""
        return [
            (t, self.work / ("train" if i == 0 else f"train-t{t:g}")) for i, t in enumerate(self.temperatures)
        ]

    def top_layer(self, num_layers: int) -> int | None:
        """The layer whose states feed a top-input head (the last), or None for the paper's head."""
        return num_layers if self.top_input else None


def distill(
    model: Any,
    config: DistillConfig,
    prompts: list[Any] | None = None,
    heldout: list[Any] | None = None,
    tokenizer: Any = None,
    progress: bool = True,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Generate data, train, save the head to ``config.out`` and evaluate it on held-out prompts.

    ``prompts``/``heldout``: texts (encoded with ``tokenizer``'s chat template) or token-id lists;
    by default the shipped train and held-out sets. Returns the report also stored in the head.
    """
    adapter = find_adapter(model)
    if config.init_head is not None:
        _adopt_head(adapter, config)
    _check(adapter, config)
    train_ids, held_ids = _prompt_ids(prompts, heldout, tokenizer)
    train_ids = train_ids[config.first_prompt :]
    if not train_ids:
        raise ConfigError("No training prompts: give at least one (--prompts N with N >= 1).")
    eos = _eos_ids(model)
    target = fingerprint(model)
    started = time.perf_counter()
    capture, top = config.capture(adapter.num_layers), config.top_layer(adapter.num_layers)
    shards = []
    for temperature, directory in config.train_dirs():
        settings = config.capture(adapter.num_layers, temperature)
        shards += generate_shards(adapter, train_ids, directory, settings, eos, progress, target)
    held_shards = generate_shards(adapter, held_ids, config.work / "heldout", capture, eos, progress, target)
    generate_seconds = time.perf_counter() - started
    samples = read_shards(shards, config.exit_layer, top)
    if config.init_head is not None:
        head = load_head(config.init_head, adapter).float()
        head.init_layer = adapter.num_layers - 1 if config.init_layer is None else config.init_layer
    else:
        vocab_ids = None
        if config.vocab_size_subset and config.vocab_size_subset < adapter.vocab_size:
            vocab_ids = rank_vocab(samples, adapter.vocab_size, config.vocab_size_subset, eos)
        head = new_head(adapter, config, vocab_ids)
    trained = train_head(
        head, samples, config.train, config.work / "checkpoint.pt", config.resume, progress, max_steps
    )
    report = {
        "settings": _settings(config),
        "data": {
            "first_prompt": config.first_prompt,
            "train_prompts": len(train_ids),
            "responses_per_prompt": len(config.temperatures),
            "train_positions": sum(len(s.response) for s in samples),
            "context_positions": sum(len(s.hidden) for s in samples),
            "heldout_prompts": len(held_ids),
        },
        "steps": trained.steps,
        "final_loss": trained.final_loss,
        "generate_seconds": round(generate_seconds, 1),
        "train_seconds": round(trained.seconds, 1),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    save_head(head, adapter, config.out, training=report, storage=config.head_storage)
    held = read_shards(held_shards, config.exit_layer, top)
    report["eval"] = evaluate(model, config.out, held_ids, config, held, eos, progress)
    save_head(head, adapter, config.out, training=report, storage=config.head_storage)
    return report


def evaluate(
    model: Any,
    head_path: str | Path,
    prompts: list[list[int]],
    config: DistillConfig,
    samples: list[Any] | None = None,
    eos: list[int] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Teacher-forced agreement on ``samples`` (if given) and real decoding on ``prompts``."""
    eos = _eos_ids(model) if eos is None else eos
    result: dict[str, Any] = {}
    if samples:
        result["teacher_forced"] = teacher_forced(load_head(head_path, find_adapter(model)), samples)
    chosen = prompts[: config.eval_prompts]
    if chosen:
        result["decoding"] = decode_stats(
            model, head_path, chosen, config.eval_max_new_tokens, config.eval_k, eos, progress
        )
    return result


def evaluate_only(
    model: Any,
    head_path: str | Path,
    config: DistillConfig,
    heldout: list[Any] | None = None,
    tokenizer: Any = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate an existing head file; held-out data at its exit layer goes to the work directory."""
    adapter = find_adapter(model)
    spec = check_head(head_path, adapter)
    config.exit_layer, config.top_input = spec.exit_layer, spec.top_input
    _, held_ids = _prompt_ids([], heldout, tokenizer)
    eos = _eos_ids(model)
    capture = config.capture(adapter.num_layers)
    shards = generate_shards(
        adapter, held_ids, config.work / "heldout", capture, eos, progress, fingerprint(model)
    )
    held = read_shards(shards, config.exit_layer, config.top_layer(adapter.num_layers))
    return evaluate(model, head_path, held_ids, config, held, eos, progress)


def new_head(adapter: Any, config: DistillConfig, vocab_ids: torch.Tensor | None) -> ExitHead:
    """A float32 exit head of ``head_layers`` copies of target layer ``init_layer`` (default: last)."""
    try:
        head = ExitHead(
            adapter,
            config.exit_layer,
            config.head_layers,
            init_layer=config.init_layer,
            vocab_ids=vocab_ids,
            top_input=config.top_input,
            mlp_width=config.mlp_width or None,
        )
    except ValueError as exc:
        raise ConfigError(f"--head-mlp-width {config.mlp_width}: {exc}.") from None
    head.init_layer = adapter.num_layers - 1 if config.init_layer is None else config.init_layer
    return head.float()


def _adopt_head(adapter: Any, config: DistillConfig) -> None:
    """Take the shape of the head to continue (``init_head``) into ``config``: its exit layer and
    input decide the data, its layers, MLP width and vocabulary subset what trains. A head made for
    another model, or at another exit layer than ``config`` names, is refused before any work."""
    spec = check_head(config.init_head, adapter)
    layer = spec.exit_layer
    if config.exit_layer != layer:
        raise ConfigError(
            f"exit layer {config.exit_layer} but the head to continue ({config.init_head}) drafts from "
            f"layer {layer}: drop --exit-layer or give a head distilled at layer {config.exit_layer}."
        )
    config.head_layers, config.top_input = spec.num_layers, spec.top_input
    config.mlp_width, config.init_layer = spec.mlp_width, spec.init_layer
    config.vocab_size_subset = spec.vocab_subset or 0


def _check(adapter: Any, config: DistillConfig) -> None:
    """Refuse settings that cannot work before any time is spent generating."""
    if config.first_prompt < 0:
        raise ConfigError(f"--first-prompt must be >= 0, got {config.first_prompt}.")
    if not 1 <= config.exit_layer < adapter.num_layers:
        raise ConfigError(
            f"--exit-layer {config.exit_layer} is out of range for a model of {adapter.num_layers} layers: "
            f"choose 1 <= N <= {adapter.num_layers - 1}."
        )
    bad = [n for n in config.capture_layers if not 1 <= n <= adapter.num_layers]
    if bad:
        raise ConfigError(
            f"--capture-layers {bad} are out of range for a model of {adapter.num_layers} layers: "
            f"choose layers in 1..{adapter.num_layers} ({adapter.num_layers}: the last, before the norm)."
        )
    if config.init_layer is not None and not 0 <= config.init_layer < adapter.num_layers:
        raise ConfigError(f"--init-layer must be in [0, {adapter.num_layers}), got {config.init_layer}.")
    if config.head_storage not in ("float", "int8"):
        raise ConfigError(f"--head-storage must be float or int8, got {config.head_storage!r}.")
    positive = {
        "max-new-tokens": config.max_new_tokens,
        "generate-batch": config.generate_batch,
        "head-layers": config.head_layers,
        "epochs": config.train.epochs,
        "batch-tokens": config.train.batch_tokens,
    }
    for name, value in positive.items():
        if value < 1:
            raise ConfigError(f"--{name} must be at least 1, got {value}.")
    temperatures = config.temperatures
    if not temperatures or min(temperatures) < 0 or len(set(temperatures)) != len(temperatures):
        raise ConfigError(
            f"--temperature takes distinct temperatures >= 0 (0: greedy), one response per prompt at each; "
            f"got {','.join(f'{t:g}' for t in temperatures) or 'none'}."
        )
    if not 1 <= config.top_k <= adapter.vocab_size:
        raise ConfigError(f"--teacher-top-k must be in [1, {adapter.vocab_size}], got {config.top_k}.")
    if config.vocab_size_subset < 0 or config.train.lr <= 0:
        raise ConfigError("--vocab-size-subset must be >= 0 and --lr > 0.")
    if config.mlp_width:
        _check_mlp_width(adapter, config)


def _check_mlp_width(adapter: Any, config: DistillConfig) -> None:
    from eesd_early_exit.head import mlp_width_of

    source = adapter.num_layers - 1 if config.init_layer is None else config.init_layer
    try:
        width = mlp_width_of(adapter.copy_layer(source, 0))
    except ValueError as exc:
        raise ConfigError(f"--head-mlp-width cannot apply: {exc}.") from None
    if not 1 <= config.mlp_width <= width:
        raise ConfigError(
            f"--head-mlp-width must be in 1..{width} (the MLP width of layer {source}), or 0 for all of it; "
            f"got {config.mlp_width}."
        )


def _prompt_ids(prompts: Any, heldout: Any, tokenizer: Any) -> tuple[list[list[int]], list[list[int]]]:
    prompts = load_prompts("train") if prompts is None else prompts
    heldout = load_prompts("heldout") if heldout is None else heldout
    return encode_prompts(prompts, tokenizer), encode_prompts(heldout, tokenizer)


def _eos_ids(model: Any) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def _settings(config: DistillConfig) -> dict[str, Any]:
    settings = asdict(config)
    settings["out"], settings["work_dir"] = str(config.out), str(config.work)
    settings["init_head"] = None if config.init_head is None else str(config.init_head)
    return settings


# -- command line (its arguments: :mod:`eesd_early_exit.command`) ----------------------------


def run_distill(args: argparse.Namespace) -> int:
    from eesd_core import SpeculativeDecoder
    from eesd_core.registry import resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.eval_only is None and (args.out is None or args.exit_layer is None and args.init_head is None):
        raise ConfigError(
            "eesd distill needs --exit-layer (or --init-head HEAD) and --out, or --eval-only HEAD."
        )
    path = resolve_model(args.model, cache_dir=args.cache_dir)
    dec = SpeculativeDecoder.from_pretrained(str(path), drafter=None, device=args.device)
    config = _config_from(args)
    heldout = load_prompts(path=args.heldout_file) if args.heldout_file else load_prompts("heldout")
    heldout = heldout[: args.heldout]
    if args.eval_only:
        result = evaluate_only(
            dec.model, args.eval_only, config, heldout, dec.tokenizer, not args.no_progress
        )
    else:
        prompts = load_prompts(path=args.prompt_file) if args.prompt_file else load_prompts("train")
        chosen = prompts[: config.first_prompt + args.prompts]
        if len(chosen) <= config.first_prompt:
            raise ConfigError(
                f"--first-prompt {config.first_prompt} leaves none of the {len(prompts)} prompts to train on."
            )
        report = distill(dec.model, config, chosen, heldout, dec.tokenizer, not args.no_progress)
        result = report["eval"]
        print(
            f"wrote {config.out}: {report['steps']} steps, loss {report['final_loss']:.4f}, "
            f"generate {report['generate_seconds']} s, train {report['train_seconds']} s"
        )
    print(format_report(result))
    print(json.dumps(result))
    return 0


def _config_from(args: argparse.Namespace) -> DistillConfig:
    train = TrainSettings(**{name: getattr(args, name) for name in asdict(TrainSettings())})
    out = args.out or args.eval_only
    layer = args.exit_layer or (int(read_metadata(args.init_head)["exit_layer"]) if args.init_head else 1)
    return DistillConfig(
        exit_layer=layer,
        out=out,
        work_dir=args.work_dir,
        max_new_tokens=args.max_new_tokens,
        top_k=args.teacher_top_k,
        temperatures=_numbers(args.temperature, float, "--temperature"),
        generate_batch=args.generate_batch,
        init_layer=args.init_layer,
        head_layers=args.head_layers,
        mlp_width=args.head_mlp_width,
        head_storage=args.head_storage,
        vocab_size_subset=args.vocab_size_subset,
        top_input=args.top_input,
        capture_layers=_numbers(args.capture_layers, int, "--capture-layers"),
        train=train,
        eval_prompts=args.eval_prompts,
        eval_max_new_tokens=args.eval_max_new_tokens,
        eval_k=args.eval_k,
        resume=args.resume,
        init_head=args.init_head,
        first_prompt=args.first_prompt,
    )


def _numbers(text: str, kind: type, option: str) -> tuple[Any, ...]:
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{option} takes comma-separated {kind.__name__}s, got {text!r}.") from None
