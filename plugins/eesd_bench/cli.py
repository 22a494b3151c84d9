"""``eesd bench``: run the Spec-Bench protocol on a set of methods and write JSON, Markdown and a plot."""

from __future__ import annotations

import argparse
import shutil
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eesd_bench.batch import add_batch
from eesd_bench.helptext import DefaultsFormatter, plain_text
from eesd_bench.kernels import add_sdpa_argument, attention_kernels
from eesd_bench.methods import GROUPS, PRESETS, expand_methods
from eesd_bench.prompts import DEFAULT_QUESTIONS, load_questions, select
from eesd_core.errors import ConfigError
from eesd_core.tools import add_device_arguments

if TYPE_CHECKING:
    from eesd_bench.runners import BenchSettings


def benchmarks_dir() -> Path:
    """The repository's ``benchmarks/`` when run from a checkout, else ``./benchmarks``."""
    checkout = Path(__file__).resolve().parents[2] / "benchmarks"
    return checkout if checkout.is_dir() else Path("benchmarks")


def add_bench(sub: Any) -> None:
    parser = sub.add_parser(
        "bench",
        help="benchmark methods on Spec-Bench prompts (interleaved, batch size 1)",
        description=plain_text(__doc__),
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="checkpoint directory or known model"
    )
    parser.add_argument(
        "--assistant-model",
        default=None,
        metavar="MODEL",
        help="hf_assisted's draft model: checkpoint directory or known model sharing the target's "
        "tokenizer (loaded once, in --dtype; default: none, needed by hf_assisted only)",
    )
    parser.add_argument("--cache-dir", default=None, help="where fetched models live (default: eesd's cache)")
    add_device_arguments(parser)
    parser.add_argument("--questions", default=str(DEFAULT_QUESTIONS), help="Spec-Bench question.jsonl")
    parser.add_argument(
        "--per-category",
        type=int,
        default=None,
        metavar="N",
        help="N questions of each category (default: all)",
    )
    parser.add_argument(
        "--subset-seed",
        type=int,
        default=None,
        help="draw the N at random with this seed (default: take the first N)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["default"],
        metavar="METHOD",
        help=f"presets ({', '.join(PRESETS)}), groups ({', '.join(GROUPS)}) or "
        "KIND:key=value,... specs (see eesd_bench.methods)",
    )
    parser.add_argument("--baseline", default="hf", help="the method speedups are relative to")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampled")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the first prompt (+1 each)")
    parser.add_argument(
        "--exit-layer",
        type=int,
        default=None,
        help="N for every early-exit method (default: the drafter's choice)",
    )
    parser.add_argument(
        "--head",
        default="auto",
        help="exit-head file, 'none' (untrained) or 'auto' (one beside the checkpoint, else the "
        "early-exit drafter's shipped head for this model, if any)",
    )
    parser.add_argument("--max-draft-tokens", type=int, default=8)
    parser.add_argument("--runs", type=int, default=1, help="repeat the whole set (Spec-Bench reports 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--group-by", default="task", choices=["task", "category"])
    parser.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="probe each method's peak memory in a fresh process",
    )
    parser.add_argument("--modelled", action="store_true", help="add the modelled speedup by alpha and k")
    parser.add_argument("--out", default=None, help="output directory (default benchmarks/out/<time>)")
    parser.add_argument("--record", action="store_true", help="also copy the results to benchmarks/results/")
    parser.add_argument(
        "--name", default=None, help="model label in recorded file names (default: the model's)"
    )
    parser.add_argument("--no-progress", action="store_true")
    add_sdpa_argument(parser)
    parser.set_defaults(func=run_bench)
    add_batch(sub)


def _head(choice: str, model_dir: Path, exit_layer: int | None) -> str | None:
    if choice == "none":
        return None
    if choice == "auto":
        from eesd_bench.runners import find_head

        return find_head(model_dir, exit_layer) or "auto"
    return str(Path(choice).expanduser())


def _load(args: argparse.Namespace) -> tuple[Any, Any, Path]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    from eesd_core.devices import resolve_device, resolve_dtype
    from eesd_core.registry import resolve_model

    logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model(args.model, cache_dir=args.cache_dir)
    dtype, device = resolve_dtype(args.dtype), resolve_device(args.device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()  # type: ignore[arg-type]
    return model, AutoTokenizer.from_pretrained(path), path


def _assistant(args: argparse.Namespace, methods: list[Any], tokenizer: Any, notes: list[str]) -> str | None:
    """The checkpoint of ``hf_assisted``'s draft model, its tokenizer checked against the target's."""
    from transformers import AutoTokenizer

    from eesd_core.registry import resolve_model

    if not any(m.kind == "hf_assisted" for m in methods):
        if args.assistant_model:
            notes.append("--assistant-model unused: no hf_assisted method was asked for")
        return None
    path = resolve_model(args.assistant_model, cache_dir=args.cache_dir)
    if AutoTokenizer.from_pretrained(path).get_vocab() != tokenizer.get_vocab():
        raise ConfigError(
            f"The assistant model {args.assistant_model!r} does not share the target's tokenizer: "
            "hf_assisted needs a draft model of the same family."
        )
    return str(path)


def _registered() -> dict[str, list[str]]:
    from eesd_core.registry import KINDS, get_manager

    manager = get_manager()
    return {kind: manager.registry(kind).names() for kind in KINDS}


def run_bench(args: argparse.Namespace) -> int:
    from eesd_bench.runners import BenchSettings, early_exit_decoder
    from eesd_bench.session import Session
    from eesd_core.tools import encode_prompt

    methods, notes = expand_methods(args.methods, _registered())
    if any(m.kind == "hf_assisted" for m in methods) and not args.assistant_model:
        raise ConfigError("hf_assisted drafts with a separate model: name it with --assistant-model.")
    questions = select(load_questions(args.questions), args.per_category, args.subset_seed)
    model, tokenizer, path = _load(args)
    prompts = [(q, encode_prompt(tokenizer, q.text)) for q in questions]
    settings = BenchSettings(
        args.max_new_tokens,
        args.temperature,
        args.seed,
        args.exit_layer,
        _head(args.head, path, args.exit_layer),
        args.max_draft_tokens,
        _assistant(args, methods, tokenizer, notes),
    )
    early_exit = None
    if any(("drafter", "early_exit") in m.plugins() for m in methods):
        early_exit = early_exit_decoder(model, settings).drafter
    name = args.name or (args.model if "/" not in args.model else path.name)
    session = Session(
        model, prompts, methods, settings, notes, model_name=args.model, assistant_name=args.assistant_model
    )
    with attention_kernels(args.sdpa):
        result = session.run(
            baseline=args.baseline, runs=args.runs, group_by=args.group_by, progress=not args.no_progress
        )
    result["settings"].update(
        model=str(path),
        dtype=args.dtype,
        questions=args.questions,
        per_category=args.per_category,
        subset_seed=args.subset_seed,
        runs=args.runs,
        sdpa=args.sdpa,
        exit_layer_used=None if early_exit is None else early_exit.shared_layers,
        early_exit_drafter=None if early_exit is None else early_exit.describe(),
    )
    if args.memory:
        if model.device.type != "cpu":
            from eesd_bench.batch import CPU_ONLY_MEMORY

            result["notes"].append(CPU_ONLY_MEMORY)
        else:
            session.add_memory(result, str(path), args.dtype, args.threads)
    if args.modelled:
        session.add_modelled(result)
    if any(m.kind == "oracle" for m in methods):
        session.add_oracle(result)
    out = Path(args.out) if args.out else benchmarks_dir() / "out" / datetime.now().strftime("%Y%m%d-%H%M%S")
    files = session.write(result, out)
    print(session.overview(result))
    for file in files:
        print(f"wrote {file}", file=sys.stderr)
    if args.record:
        for file in record(files, benchmarks_dir() / "results", name, settings):
            print(f"recorded {file}", file=sys.stderr)
    return 0


def record(files: list[Path], target: Path, name: str, settings: BenchSettings) -> list[Path]:
    """Copy a run's files to ``target`` as ``<name>-<greedy|tX>.<ext>``, replacing the previous ones."""
    mode = "greedy" if settings.greedy else f"t{settings.temperature:g}"
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for file in files:
        copy = target / f"{name}-{mode}{file.suffix}"
        shutil.copyfile(file, copy)
        copied.append(copy)
    return copied
