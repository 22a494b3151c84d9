"""transformers' ``generate()`` keywords for eesd: ``generation_config``, ``do_sample``,
``repetition_penalty``, ``no_repeat_ngram_size``, ``bad_words_ids``, ``suppress_tokens``,
``sequence_bias``, ``min_length``, ``prefix_allowed_tokens_fn``, ``stop_strings``, a user's
``logits_processor`` and ``stopping_criteria``, with transformers' meanings (``docs/generate.md``).

They become the core's ``logits_processor`` and ``stopping_criteria``, which a round applies at
every position with the prefix the target would have seen there, to p and q alike, so speculation
stays lossless. What eesd cannot honour so is refused by name (:data:`eesd_hf.keywords.REFUSED`).
"""

from __future__ import annotations

from typing import Any

from eesd_core.hookspecs import hookimpl


@hookimpl
def eesd_generation_keywords(decoder: Any, keywords: dict[str, Any]) -> None:
    from eesd_hf.keywords import translate  # transformers loads on the first call, not with the plug-in

    translate(decoder, keywords)
