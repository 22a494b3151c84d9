"""eesd drafting inside vLLM: an early-exit proposer for vLLM's ``custom_class`` speculative method.

Serve any checkpoint eesd's adapters know with eesd drafting::

    from vllm import LLM
    import eesd_vllm

    llm = LLM(model=path, enforce_eager=True, speculative_config=eesd_vllm.speculative_config(8))

or from the command line (``eesd vllm-config`` prints the settings; it is this package's command)::

    eval "$(eesd vllm-config --model smollm2-135m-instruct)"
    vllm serve "$EESD_VLLM_MODEL" --speculative-config "$EESD_VLLM_SPEC" --enforce-eager

(eager, so that the proposer can read the target's last-layer states for a top-input head).

The proposer is :class:`eesd_vllm.proposer.EarlyExitProposer`; its options (exit layer, head,
controller) are :class:`eesd_vllm.options.ProposerOptions`. Importing this package imports neither
torch nor vLLM; the proposer class loads on first use.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from typing import Any

from eesd_core.errors import ConfigError
from eesd_core.hookspecs import hookimpl
from eesd_vllm.options import OPTIONS_ENV, ProposerOptions

PROPOSER = "eesd_vllm.EarlyExitProposer"

__all__ = ["OPTIONS_ENV", "PROPOSER", "EarlyExitProposer", "ProposerOptions", "speculative_config"]


def speculative_config(num_speculative_tokens: int = 8, **options: Any) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for the eesd proposer; ``options`` (checked here, so a typo
    fails before vLLM starts) go to ``EESD_VLLM_OPTIONS`` in this process's environment, which
    the processes vLLM starts inherit."""
    from eesd_core.config import validate

    checked = validate(ProposerOptions, options, "eesd proposer options")
    os.environ[OPTIONS_ENV] = json.dumps(checked.model_dump(mode="json", exclude_defaults=True))
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": num_speculative_tokens}


@hookimpl
def eesd_cli_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "vllm-config",
        help="print the shell settings that make `vllm serve` draft with eesd",
        description="Print EESD_VLLM_SPEC (vLLM's --speculative-config), EESD_VLLM_OPTIONS (the "
        "proposer's options) and, with --model, EESD_VLLM_MODEL (the checkpoint directory), as "
        'export lines: eval "$(eesd vllm-config --model NAME)".',
    )
    parser.add_argument("--model", default=None, help="a known model name (fetched if needed) or a directory")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens: the most drafts a step")
    parser.add_argument("--exit-layer", type=int, default=None)
    parser.add_argument("--head", default="auto", help="a head file, 'auto' or 'none' (the untrained exit)")
    parser.add_argument("--controller", default="thompson")
    parser.add_argument(
        "--options",
        default="{}",
        help="further proposer options as a JSON object, e.g. "
        '\'{"dtype": "bfloat16", "guard_options": {"proof_from": 2}}\'',
    )
    parser.set_defaults(func=_print_config)


def _print_config(args: argparse.Namespace) -> int:
    head = None if args.head == "none" else args.head
    try:
        extra = json.loads(args.options)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--options must be a JSON object of proposer options: {exc}.") from None
    if not isinstance(extra, dict):
        raise ConfigError(f"--options must be a JSON object, got {type(extra).__name__}.")
    options = {"exit_layer": args.exit_layer, "head": head, "controller": args.controller, **extra}
    spec = speculative_config(args.k, **options)
    lines = [
        f"export {OPTIONS_ENV}={shlex.quote(os.environ[OPTIONS_ENV])}",
        f"export EESD_VLLM_SPEC={shlex.quote(json.dumps(spec))}",
    ]
    if args.model:
        from eesd_core.registry import resolve_model

        lines.append(
            f"export EESD_VLLM_MODEL={shlex.quote(str(resolve_model(args.model, cache_dir=args.cache_dir)))}"
        )
    print("\n".join(lines))
    return 0


def __getattr__(name: str) -> Any:
    if name == "EarlyExitProposer":
        from eesd_vllm.proposer import EarlyExitProposer

        return EarlyExitProposer
    raise AttributeError(f"module 'eesd_vllm' has no attribute {name!r}")
