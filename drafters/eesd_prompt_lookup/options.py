"""Options of the prompt-lookup drafter (import-light: read when plug-ins are listed)."""

from __future__ import annotations

from pydantic import Field, model_validator

from eesd_core.config import PluginOptions


class PromptLookupOptions(PluginOptions):
    """``max_ngram``, ``min_ngram``: the longest and shortest suffix searched for, longest first.

    How many tokens a round copies is the controller's choice within the engine's draft cap.
    """

    max_ngram: int = Field(3, ge=1)
    min_ngram: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> PromptLookupOptions:
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram ({self.min_ngram}) must not exceed max_ngram ({self.max_ngram})")
        return self
