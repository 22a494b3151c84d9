"""What the ``eesd`` command and the plug-ins that add commands to it share: the arguments that
choose a model, plug-ins, device and precision, a decoder loaded from them, and a prompt encoded
for chat. Nothing here imports torch until it is used.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_decoder_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that choose a model and the plug-ins, shared by several commands."""
    model = "a local HF checkpoint directory, or a model name a plug-in knows (`eesd models list`)"
    parser.add_argument("--model", default="smollm2-135m-instruct", help=model)
    parser.add_argument("--drafter", default="early_exit", help="drafter plug-in ('none': plain decoding)")
    parser.add_argument("--drafter-options", type=json_object, default={}, help="a JSON object")
    parser.add_argument("--controller", default="thompson", help="controller plug-in")
    parser.add_argument("--controller-options", type=json_object, default={}, help="a JSON object")
    parser.add_argument("--verifier", default="lossless", help="verifier plug-in")
    parser.add_argument("--max-draft-tokens", type=int, default=8, help="most drafts in a round")
    parser.add_argument("--cache-dir", default=None, help="where fetched models live (None: the XDG cache)")
    products = "how linear layers multiply: auto (a plug-in may time faster CPU products, once per machine)"
    parser.add_argument("--products", default="auto", help=products + " or standard (F.linear)")
    parser.add_argument("--compile", default="auto", help="how passes run: auto, off (eager) or static")
    add_device_arguments(parser)


def json_object(text: str) -> dict[str, Any]:
    """An options argument: a JSON object, or an error that says what is wrong with it."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({exc}); write e.g. '{{\"k\": 4}}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is JSON but not an object; write e.g. '{{\"k\": 4}}'")
    return value


def add_device_arguments(parser: argparse.ArgumentParser, dtype: str = "float32") -> None:
    """``--device`` and ``--dtype``: where the model runs and the precision of its weights."""
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps")
    precision = "precision of the weights; p and q are still computed in float32"
    choices = ["float32", "bfloat16", "float16", "float64"]
    parser.add_argument("--dtype", default=dtype, choices=choices, help=precision)


def load_decoder(args: argparse.Namespace, **overrides: Any) -> Any:
    """A decoder for the model and plug-ins ``args`` name (see :func:`add_decoder_arguments`)."""
    from eesd_core.engine import SpeculativeDecoder
    from eesd_core.registry import resolve_model

    path = resolve_model(args.model, cache_dir=args.cache_dir)
    options: dict[str, Any] = dict(drafter=None if args.drafter == "none" else args.drafter)
    options.update(drafter_options=args.drafter_options, controller=args.controller, verifier=args.verifier)
    options.update(controller_options=args.controller_options, max_draft_tokens=args.max_draft_tokens)
    adapter = {name: getattr(args, name, "auto") for name in ("products", "compile")}
    options = {"adapter_options": adapter, **options, **overrides}
    return SpeculativeDecoder.from_pretrained(str(path), dtype=args.dtype, device=args.device, **options)


def encode_prompt(tokenizer: Any, text: str, chat: bool = True) -> list[int]:
    """Token ids of ``text``, wrapped in the tokenizer's chat template when it has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a dict or a BatchEncoding
    return tokenizer(text)["input_ids"]
