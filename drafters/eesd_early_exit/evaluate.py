"""Held-out evaluation of an exit head: what it predicts, and what it earns in real decoding.

* Teacher-forced: on held-out generated data, how often the head's argmax equals the target's, and
  the KL to the teacher's top-k (the training loss on unseen prompts).
* Decoding: the real :class:`~eesd_core.SpeculativeDecoder` with the head, fixed k drafts per round,
  greedy; its own counters give per-position acceptance and mean accepted tokens per target pass.
  Nothing is simulated, so the numbers are exactly what decoding with this head does.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from eesd_early_exit.data import Sample
from eesd_early_exit.train import batches, collate, distill_loss, forward, frozen_lm_weight, vocab_map


@torch.no_grad()
def teacher_forced(head: Any, samples: list[Sample], batch_tokens: int = 2048) -> dict[str, float]:
    """Top-1 agreement with the target's argmax, and KL to its top-k, over response positions."""
    head = head.float().eval()
    lm_weight, mapping = frozen_lm_weight(head), vocab_map(head)
    agree = positions = 0
    kl_sum = 0.0
    for index in batches(samples, batch_tokens, None):
        batch = {name: t.to(lm_weight.device) for name, t in collate(samples, index, mapping).items()}
        logits = forward(head, lm_weight, batch)
        n = logits.shape[0]
        agree += int((logits.argmax(-1) == batch["ids"][:, 0]).sum())
        kl_sum += float(distill_loss(logits, batch["ids"], batch["logprobs"], 0.0)) * n
        positions += n
    return {"top1": agree / max(positions, 1), "kl": kl_sum / max(positions, 1), "positions": positions}


def decode_stats(
    model: Any,
    head_path: str | Path,
    prompts: list[list[int]],
    max_new_tokens: int,
    k: int = 8,
    eos_ids: list[int] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Greedy speculative decoding of ``prompts`` with the head and ``k`` drafts per round."""
    from tqdm.auto import tqdm

    from eesd_core import SpeculativeDecoder

    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"head": str(head_path)},
        controller="fixed",
        controller_options={"k": k},
        max_draft_tokens=k,
    )
    drafted, accepted = [0] * k, [0] * k
    rounds = new_tokens = 0
    started = time.perf_counter()
    for ids in tqdm(prompts, desc="evaluate", unit="prompt", disable=not progress):
        stats = dec.generate(ids, max_new_tokens=max_new_tokens, temperature=0.0, eos_token_id=eos_ids).stats
        rounds += stats.rounds
        new_tokens += stats.new_tokens
        for i, (d, a) in enumerate(zip(stats.drafted_by_position, stats.accepted_by_position, strict=True)):
            drafted[i] += d
            accepted[i] += a
    return summarise(drafted, accepted, rounds, new_tokens, time.perf_counter() - started)


def summarise(drafted: list[int], accepted: list[int], rounds: int, new_tokens: int, seconds: float) -> dict:
    """Acceptance at draft position i is P(n > i): accepted there over drafted there."""
    by_position = [a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=True)]
    return {
        "first_draft_acceptance": by_position[0] if by_position else 0.0,
        "acceptance_by_position": by_position,
        "mean_accepted_tokens": new_tokens / rounds if rounds else 0.0,
        "rounds": rounds,
        "new_tokens": new_tokens,
        "drafted_by_position": drafted,
        "accepted_by_position": accepted,
        "seconds": seconds,
    }


def format_report(result: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    lines = []
    if "teacher_forced" in result:
        tf = result["teacher_forced"]
        lines.append(
            f"top-1 agreement (teacher-forced): {tf['top1']:.3f}  KL: {tf['kl']:.3f}  "
            f"over {tf['positions']} held-out positions"
        )
    if "decoding" in result:
        dec = result["decoding"]
        rates = " ".join(f"{r:.2f}" for r in dec["acceptance_by_position"])
        lines.append(f"acceptance by draft position: {rates}")
        lines.append(
            f"mean accepted tokens per target pass (k<={len(dec['drafted_by_position'])}): "
            f"{dec['mean_accepted_tokens']:.3f} over {dec['rounds']} rounds, "
            f"{dec['new_tokens']} tokens, {dec['seconds']:.1f} s"
        )
    return "\n".join(lines)
