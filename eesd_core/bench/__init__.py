"""The benchmark harness behind ``eesd bench``: Spec-Bench's protocol for eesd and its baselines.

Spec-Bench prompts (first turn, chat template), batch size 1, one process, every method on every
prompt in rotating order after one warm-up generation each; speedup is the ratio of mean tokens per
second to transformers' plain ``generate()``; every greedy output is checked against the
baseline's token for token. Methods are named by spec strings (:mod:`eesd_core.bench.methods`) and
built through the plug-in registry, never by importing a plug-in.
"""

from __future__ import annotations

from eesd_core.bench.methods import GROUPS, PRESETS, MethodSpec, expand_methods, parse_method
from eesd_core.bench.prompts import Question, load_questions, select
from eesd_core.bench.report import markdown, summarize
from eesd_core.bench.run import first_difference, run_benchmark
from eesd_core.bench.runners import BenchSettings
from eesd_core.bench.session import Session

__all__ = [
    "GROUPS",
    "PRESETS",
    "BenchSettings",
    "MethodSpec",
    "Question",
    "Session",
    "expand_methods",
    "first_difference",
    "load_questions",
    "markdown",
    "parse_method",
    "run_benchmark",
    "select",
    "summarize",
]
