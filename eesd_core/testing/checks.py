"""One-call checks of the engine's invariants on a toy target; the contract classes are built on them.

Each ``check_*`` raises :class:`~eesd_core.testing.errors.DistributionMismatch` (an
``AssertionError``) or another :class:`~eesd_core.testing.errors.KitError` with the evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from eesd_core.protocols import SamplingParams, Verifier
from eesd_core.sampling import process_logits
from eesd_core.testing.errors import DistributionMismatch
from eesd_core.testing.kit import Setup, installed
from eesd_core.testing.oracles import (
    assert_distributions_equal,
    autoregressive_distribution,
    engine_batch_distribution,
    engine_distribution,
    independent_rows,
    round_distribution,
    verified,
)
from eesd_core.testing.randomness import NoRandom, ScriptedRandom
from eesd_core.testing.toy import ToyModel


def _target(model: ToyModel, prompt: Sequence[int], sampling: SamplingParams) -> Callable[[list[int]], Any]:
    return lambda tokens: model.next_probs(list(prompt) + list(tokens), sampling)


def check_lossless(
    setup: Setup,
    prompt: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams,
    eos_token_id: Sequence[int] = (),
) -> None:
    """The engine's exact output distribution equals plain sampling from the toy target."""
    model = setup.model
    actual = engine_distribution(setup, prompt, max_new_tokens, sampling, eos_token_id)
    expected = autoregressive_distribution(
        lambda h: model.next_probs(h, sampling), prompt, max_new_tokens, eos_token_id
    )
    assert_distributions_equal(
        actual, expected, what=f"{max_new_tokens} new tokens after {list(prompt)} on {model!r} at {sampling}"
    )


def check_bounds(
    setup: Setup, prompt: Sequence[int], max_new_tokens: int, sampling: SamplingParams, seed: int = 0
) -> None:
    """Every round stays within the draft cap and the token budget, and commits n + 1 tokens; the
    first new token comes from the prefill, so the rounds start at the position after the prompt."""
    with installed(setup.subjects()) as kit:
        result = setup.build().generate(
            list(prompt),
            max_new_tokens=max_new_tokens,
            seed=seed,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            eos_token_id=[],
        )
    committed = 1  # the prefill's token
    for r in kit.rounds:
        budget = min(setup.max_draft_tokens, max_new_tokens - committed - 1)
        if not 0 <= r.accepted <= r.drafted <= budget or len(r.tokens) != r.accepted + 1:
            raise DistributionMismatch(
                f"A round drafted {r.drafted} (at most {budget} allowed), accepted {r.accepted} and "
                f"committed {len(r.tokens)} tokens (must be accepted + 1)."
            )
        if r.position != len(prompt) - 1 + committed:
            raise DistributionMismatch(
                f"A round started at position {r.position}, not {len(prompt) - 1 + committed}."
            )
        committed += len(r.tokens)
    new = result.sequences.shape[1] - len(prompt)  # type: ignore[union-attr]
    if new != max_new_tokens or min(committed, max_new_tokens) != new:
        raise DistributionMismatch(f"Generated {new} tokens ({committed} committed), not {max_new_tokens}.")


def greedy_tokens(model: ToyModel, prompt: Sequence[int], max_new_tokens: int) -> tuple[int, ...]:
    """The target's greedy decoding: argmax (first maximum) at every step."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        tokens.append(int(model.logits(tokens).argmax()))
    return tuple(tokens[len(prompt) :])


def check_greedy(setup: Setup, prompt: Sequence[int], max_new_tokens: int) -> None:
    """At temperature 0 the engine outputs the target's greedy tokens, with probability 1."""
    actual = engine_distribution(setup, prompt, max_new_tokens, SamplingParams(0.0))
    expected = {greedy_tokens(setup.model, prompt, max_new_tokens): 1.0}
    assert_distributions_equal(
        actual, expected, what=f"greedy decoding after {list(prompt)} on {setup.model!r}"
    )


def check_lossless_batch(
    setup: Setup,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingParams,
    eos_token_id: Sequence[int] = (),
) -> None:
    """A batched call's joint output distribution equals independent plain sampling of each row."""
    model = setup.model
    actual = engine_batch_distribution(setup, prompts, max_new_tokens, sampling, eos_token_id)
    expected = independent_rows(
        [
            autoregressive_distribution(
                lambda h: model.next_probs(h, sampling), p, max_new_tokens, eos_token_id
            )
            for p in prompts
        ]
    )
    assert_distributions_equal(
        actual,
        expected,
        what=f"a batch of {[list(p) for p in prompts]}: {max_new_tokens} new tokens, {model!r}, {sampling}",
    )


def check_greedy_batch(
    setup: Setup, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_token_id: Sequence[int] = ()
) -> None:
    """At temperature 0 every row of a batched call is that row's greedy decoding alone."""
    actual = engine_batch_distribution(setup, prompts, max_new_tokens, SamplingParams(0.0), eos_token_id)
    expected = {tuple(_greedy_until(setup.model, p, max_new_tokens, eos_token_id) for p in prompts): 1.0}
    assert_distributions_equal(
        actual, expected, what=f"greedy decoding of the batch {[list(p) for p in prompts]} on {setup.model!r}"
    )


def _greedy_until(
    model: ToyModel, prompt: Sequence[int], max_new_tokens: int, eos: Sequence[int]
) -> tuple[int, ...]:
    tokens = greedy_tokens(model, prompt, max_new_tokens)
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def check_round(
    verifier: Verifier,
    model: ToyModel,
    prompt: Sequence[int],
    k: int,
    sampling: SamplingParams,
    deterministic: bool = False,
) -> None:
    """One round of ``k`` drafts from the draft table, then plain sampling, equals plain sampling."""

    def draft(tokens: list[int]) -> torch.Tensor:
        return process_logits(model.logits(list(prompt) + tokens, draft=True)[None], sampling)[0]

    target = _target(model, prompt, sampling)
    actual = round_distribution(verifier, target, draft, k, deterministic)
    expected = autoregressive_distribution(lambda h: target(h[len(prompt) :]), prompt, k + 1)
    assert_distributions_equal(
        actual,
        expected,
        what=f"one round of {k} drafts (deterministic={deterministic}) "
        f"after {list(prompt)} on {model!r} at {sampling}",
    )


def check_exact_match(verifier: Verifier, drafts: Sequence[int], p: torch.Tensor) -> None:
    """With one-hot p and q=None, accept the drafts that equal argmax p, emit the next argmax: no draws."""
    targets = p.argmax(-1).tolist()
    n = 0
    while n < len(drafts) and drafts[n] == targets[n]:
        n += 1
    row = torch.tensor(list(drafts), dtype=torch.long)
    got = verified(verifier.verify([row], [None], p[None], [NoRandom()]), [row], p.shape[-1])[0]
    if got != (n, targets[n]):
        raise DistributionMismatch(
            f"Greedy verification of drafts {list(drafts)} against argmax {targets} returned {tuple(got)}, "
            f"not {(n, targets[n])}."
        )


def check_verify_batch(
    verifier: Verifier,
    drafts: Sequence[Sequence[int]],
    qs: Sequence[torch.Tensor | None],
    p: torch.Tensor,
    uniforms: Sequence[tuple[Sequence[float], Sequence[float]]],
) -> None:
    """Rows verified together answer what each answers alone, and draw the same: a row's outcome
    does not depend on the other rows of its batch.

    Row b has ``drafts[b]``, q ``qs[b]`` (``[k_b, V]`` or None) and p ``p[b]`` of ``p`` ``[B, m, V]``
    (alone: ``p[b, : k_b + 1]``); ``uniforms[b]`` are its acceptance and sampling uniforms (a
    :class:`~eesd_core.testing.randomness.ScriptedRandom` each), handed alike to both.
    """
    rows = [torch.tensor(list(d), dtype=torch.long) for d in drafts]
    one_by_one, singles = [], [ScriptedRandom(*u) for u in uniforms]
    for b, (d, q, rng) in enumerate(zip(rows, qs, singles, strict=True)):
        one_by_one += verified(verifier.verify([d], [q], p[b : b + 1, : len(d) + 1], [rng]), [d], p.shape[-1])
    together = [ScriptedRandom(*u) for u in uniforms]
    got = verified(verifier.verify(rows, list(qs), p, together), rows, p.shape[-1])
    if got != one_by_one or [r.calls for r in together] != [r.calls for r in singles]:
        raise DistributionMismatch(
            f"Verifying the rows together returned {got} with draws {[r.calls for r in together]}; "
            f"each alone, {one_by_one} with draws {[r.calls for r in singles]} "
            f"(drafts {[list(d) for d in drafts]})."
        )
