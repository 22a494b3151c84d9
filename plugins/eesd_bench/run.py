"""The measurement loop: every method on every prompt, interleaved, one process, batch size 1.

For each prompt the methods run one after the other, the order rotating by one place per prompt,
so that slow drifts of the machine (heat, other load) fall on every method alike and the ratios
stay fair. Each method first makes one untimed warm-up generation. Seeds depend on the prompt
only, so every method sees the same seed for the same prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from eesd_bench.methods import MethodSpec
from eesd_bench.prompts import Question
from eesd_bench.runners import BenchSettings, Output, build_runner
from eesd_core.errors import ConfigError

WARMUP_TOKENS = 32


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first token where two outputs differ (a length difference counts); None if equal."""
    for i, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def rotated(items: Sequence[Any], shift: int) -> list[Any]:
    shift %= max(len(items), 1)
    return list(items[shift:]) + list(items[:shift])


def _sample(
    output: Output, spec: MethodSpec, question: Question, prompt: list[int], run: int
) -> dict[str, Any]:
    sample: dict[str, Any] = {
        "run": run,
        "question_id": question.question_id,
        "category": question.category,
        "task": question.task,
        "method": spec.name,
        "prompt_tokens": len(prompt),
        "new_tokens": len(output.tokens),
        "seconds": output.seconds,
        "tokens_per_second": len(output.tokens) / output.seconds if output.seconds > 0 else 0.0,
    }
    sample.update(output.stats)
    return sample


def _check(
    samples: list[dict[str, Any]],
    outputs: dict[str, list[int]],
    baseline: str,
    greedy: bool,
    model: Any = None,
    prompt: Sequence[int] = (),
) -> None:
    """Mark each sample equal or not to the baseline's tokens; keep tokens where they matter.

    In bfloat16/float16 a difference where the baseline's top-2 logits are within rounding is
    marked ``tie`` and is not a mismatch (the rule of :mod:`eesd_core.testing.agreement`)."""
    from eesd_core.testing.agreement import compare_greedy, logits_after

    reference = outputs[baseline]
    dtype = getattr(model, "dtype", None)
    for sample in samples:
        tokens = outputs[sample["method"]]
        diff = first_difference(tokens, reference) if greedy else None
        sample["equal"] = (diff is None) if greedy else None
        sample["first_diff"] = diff
        if diff is not None and dtype is not None:
            rows = (lambda i: logits_after(model, [*prompt, *reference[:i]])) if model is not None else None
            agreement = compare_greedy(reference, tokens, dtype, rows)
            sample["tie"] = agreement.tie
            sample["tie_gap"] = agreement.gap
        if sample["method"] == baseline or diff is not None:
            sample["tokens"] = tokens


def run_benchmark(
    model: Any,
    prompts: Sequence[tuple[Question, list[int]]],
    methods: Sequence[MethodSpec],
    settings: BenchSettings,
    *,
    baseline: str = "hf",
    runs: int = 1,
    progress: Callable[[int], Any] | None = None,
    runners: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Raw samples: one per run, prompt and method (see the module docstring for the protocol).

    ``runners`` maps method names to runners built beforehand (by :func:`build_runner` if absent),
    so that a caller can look at them after the run.
    """
    timed = [m for m in methods if m.kind != "oracle"]
    if baseline not in [m.name for m in timed]:
        raise ConfigError(f"The baseline {baseline!r} is not among the methods run: add it to --methods.")
    if not prompts:
        raise ConfigError("No prompts selected: check --questions and --per-category.")
    runners = dict(runners or {})
    for spec in timed:
        if spec.name not in runners:
            runners[spec.name] = build_runner(spec, model, settings)
    warmup = replace(settings, max_new_tokens=min(settings.max_new_tokens, WARMUP_TOKENS))
    for runner in runners.values():
        runner.generate(prompts[0][1], warmup, settings.seed)
    samples: list[dict[str, Any]] = []
    for run in range(runs):
        for index, (question, prompt) in enumerate(prompts):
            seed = settings.seed + index
            outputs: dict[str, list[int]] = {}
            batch = []
            for spec in rotated(timed, run * len(prompts) + index):
                output = runners[spec.name].generate(prompt, settings, seed)
                outputs[spec.name] = output.tokens
                batch.append(_sample(output, spec, question, prompt, run))
                if progress is not None:
                    progress(1)
            _check(batch, outputs, baseline, settings.greedy, model, prompt)
            samples.extend(batch)
    return samples
