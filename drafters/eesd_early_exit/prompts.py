"""The prompts self-distillation generates from: our own templated set, never Spec-Bench.

``prompts/train.json`` (1,730 prompts) and ``prompts/heldout.json`` (40) were built once by filling
templates: 78 topics x 23 generic tasks (explain, summarise, poem, dialogue, translate, quiz, ...),
20 coding tasks x 4 phrasings, 8 arithmetic templates with random numbers, and 30 everyday requests.
The held-out set takes 28 prompts from 8 topics that never occur in the training set, plus everyday,
code and arithmetic prompts; the two sets share no prompt. Keeping Spec-Bench out of training keeps
the benchmark an honest measure of the head.

``prompts/code-train.json`` (896 prompts) and ``prompts/code-heldout.json`` (48) are a code-heavy set
for distilling the exit heads of coder models such as Qwen2.5-Coder-1.5B-Instruct. They fill templates
of our own: 87 functions to write (strings, collections, parsing, recursion, generators, files,
regular expressions, dates, sorting, searching, graphs, dynamic programming), classes, dataclasses,
argparse scripts, SQL queries, shell one-liners, tests, and 37 short snippets (5-15 lines) to fix,
explain, refactor, annotate, test or convert to another language, which makes the model repeat code.
About half are in Python, the rest in JavaScript, TypeScript, Go, Rust, C, Java, SQL and Bash. The
held-out set draws on tasks and 7 snippets that never occur in the training set; the two share no
prompt. The generator is deterministic: regenerate both files with
``python drafters/eesd_early_exit/prompts/make_code_prompts.py``. A larger training split keeps
the smaller one as its first prompts (the first 640 are the set before it grew), so a head that
learnt from those continues on the rest (``eesd distill --init-head HEAD --first-prompt 640``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eesd_core.errors import ConfigError

PROMPT_DIR = Path(__file__).parent / "prompts"
SPLITS = ("train", "heldout", "code-train", "code-heldout")


def load_prompts(split: str = "train", path: str | Path | None = None) -> list[Any]:
    """The prompts of a shipped split, or of a JSON file: a list of strings or of token-id lists."""
    if path is None:
        if split not in SPLITS:
            raise ConfigError(f"Unknown prompt split {split!r}: choose one of {SPLITS}.")
        path = PROMPT_DIR / f"{split}.json"
    try:
        prompts = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot read prompts from {str(path)!r}: {exc}.") from None
    if not isinstance(prompts, list) or not all(_is_prompt(p) for p in prompts):
        raise ConfigError(f"{str(path)!r} must hold a JSON list of non-empty strings or token-id lists.")
    return prompts


def _is_prompt(prompt: Any) -> bool:
    if isinstance(prompt, list):
        return bool(prompt) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    return isinstance(prompt, str) and bool(prompt)


def encode_prompts(prompts: Sequence[Any], tokenizer: Any = None, chat: bool = True) -> list[list[int]]:
    """Token ids for each prompt; prompts that already are token-id lists pass through unchanged."""
    out: list[list[int]] = []
    for prompt in prompts:
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ConfigError("Text prompts need a tokenizer: pass one, or give token-id lists.")
            from eesd_core.tools import encode_prompt

            out.append(list(encode_prompt(tokenizer, prompt, chat=chat)))
        else:
            ids = [int(t) for t in prompt]
            if not ids:
                raise ConfigError("A prompt is empty: every prompt needs at least one token.")
            out.append(ids)
    return out
