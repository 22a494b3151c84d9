"""The ``eesd distill`` command's arguments (import-light: torch loads only when it runs)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from eesd_early_exit.settings import TrainSettings


def add_distill_command(subparsers: Any) -> None:
    parser = subparsers.add_parser("distill", help="self-distil an exit head for the early-exit drafter")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="HF checkpoint dir or known name")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--exit-layer", type=int, default=None, help="N: target layers the drafter runs")
    parser.add_argument("--out", default=None, help="the head file to write")
    parser.add_argument("--work-dir", default=None, help="data and checkpoints (default: OUT.work)")
    parser.add_argument("--prompts", type=int, default=320, help="number of training prompts")
    parser.add_argument("--prompt-file", default=None, help="JSON list of training prompts")
    parser.add_argument(
        "--first-prompt",
        type=int,
        default=0,
        help="skip the prompts before this index: train on --prompts prompts from here (new data "
        "for a head continued with --init-head)",
    )
    parser.add_argument("--heldout-file", default=None, help="JSON list of held-out prompts")
    parser.add_argument(
        "--heldout", type=int, default=40, help="held-out prompts for the teacher-forced eval"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--temperature",
        default="0",
        help="comma-separated response temperatures, one response per prompt at each (0: greedy; "
        "the first also makes the held-out data), e.g. 0,0.8",
    )
    parser.add_argument("--teacher-top-k", type=int, default=64, help="teacher log-probs kept per position")
    parser.add_argument("--generate-batch", type=int, default=16)
    parser.add_argument("--init-layer", type=int, default=None, help="target layer to copy (default: last)")
    parser.add_argument(
        "--head-layers", type=int, default=1, help="decoder layers in the head, each a copy of --init-layer"
    )
    parser.add_argument(
        "--head-mlp-width",
        type=int,
        default=0,
        help="hidden units kept in each head layer's MLP, those of largest weight norms (0: all)",
    )
    parser.add_argument(
        "--head-storage",
        choices=("float", "int8"),
        default="float",
        help="how the head file stores weights: bfloat16, or int8 with a scale per row (half the size)",
    )
    parser.add_argument("--vocab-size-subset", type=int, default=0, help="K: draft over K tokens (0: all)")
    parser.add_argument(
        "--top-input",
        action="store_true",
        help="also feed the head the target's last-layer state of the previous position",
    )
    parser.add_argument(
        "--capture-layers",
        default="",
        help="comma-separated layers whose states the data keeps too, so one generation serves "
        "distillations at each of them (e.g. 3,6,9,12 for a sweep over N)",
    )
    defaults = TrainSettings()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--resume", action="store_true", help="continue from the work dir's checkpoint")
    parser.add_argument(
        "--init-head",
        default=None,
        metavar="HEAD",
        help="continue training this head file on this run's data; it sets the exit layer, head shape "
        "and vocabulary subset",
    )
    parser.add_argument("--eval-only", default=None, metavar="HEAD", help="only evaluate this head file")
    parser.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts decoded for the eval")
    parser.add_argument("--eval-max-new-tokens", type=int, default=128)
    parser.add_argument("--eval-k", type=int, default=8, help="drafts per round in the eval")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the target generates the data and the head trains: cpu, cuda, cuda:N, mps "
        "(the head trains in float32 whatever the device)",
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from eesd_early_exit.distill import run_distill

    return run_distill(args)
