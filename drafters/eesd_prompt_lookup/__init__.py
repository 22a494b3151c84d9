"""Prompt-lookup drafter: drafts by copying what followed an earlier occurrence of the latest n-gram.

Text that quotes, edits or summarises its prompt repeats long spans of it; where the last few
committed tokens occurred before, the tokens that followed them then are a free guess for what
follows now (transformers' ``prompt_lookup_num_tokens``, vLLM's ``ngram`` method). No model runs:
the target verifies the guess from its own first layer. This module stays import-light (no torch).
"""

from __future__ import annotations

from typing import Any

from eesd_core.hookspecs import hookimpl
from eesd_prompt_lookup.options import PromptLookupOptions

__all__ = ["PromptLookupDrafter", "PromptLookupOptions", "find_continuation"]


def __getattr__(name: str) -> Any:
    if name in ("PromptLookupDrafter", "find_continuation"):
        from eesd_prompt_lookup import drafter

        return getattr(drafter, name)
    raise AttributeError(f"module 'eesd_prompt_lookup' has no attribute {name!r}")


def _prompt_lookup(options: PromptLookupOptions) -> Any:
    from eesd_prompt_lookup.drafter import PromptLookupDrafter

    return PromptLookupDrafter(options)


@hookimpl
def eesd_register_drafters(register: Any) -> None:
    register.add("prompt_lookup", _prompt_lookup, options=PromptLookupOptions)
