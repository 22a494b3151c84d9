"""Training the exit head to match the target's next-token distribution (self-distillation).

The first N layers are frozen and never run here: their outputs h_N were captured while the data was
generated. The exit layer sees whole sequences, prompt included, with a causal mask, exactly the
context its KV cache holds at decode time; the loss counts only positions that predict a response
token. Loss: forward KL(p || q) with p the teacher's top-k probabilities renormalised (over the
vocabulary subset, if any), plus an optional cross-entropy on the teacher's argmax.

A top-input head reads, besides h_N(t), the target's normalised last-layer state at t - 1, captured
with the data. At decode time that state is known only for the first draft of a round; later drafts
read the head's own output at t - 1 instead, so ``top_weight`` adds a regression of the head's
(normalised) output at t onto the target's state at t, which makes it a better stand-in.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from eesd_core.errors import ConfigError
from eesd_early_exit.data import Sample
from eesd_early_exit.settings import TrainSettings


@dataclass
class TrainResult:
    steps: int
    seconds: float
    losses: list[float] = field(default_factory=list)

    @property
    def final_loss(self) -> float:
        tail = self.losses[-20:]
        return sum(tail) / len(tail) if tail else float("nan")


def batches(samples: list[Sample], batch_tokens: int, generator: torch.Generator | None) -> list[list[int]]:
    """Samples of similar length grouped up to ``batch_tokens`` padded tokens, in random order."""
    order = sorted(range(len(samples)), key=lambda i: (len(samples[i].hidden), i))
    out: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and len(samples[i].hidden) * (len(current) + 1) > batch_tokens:
            out.append(current)
            current = []
        current.append(i)
    if current:
        out.append(current)
    if generator is not None:
        out = [out[j] for j in torch.randperm(len(out), generator=generator).tolist()]
    return out


def collate(
    samples: list[Sample], index: list[int], vocab_map: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """Right-padded h_N ``[B, T, H]``, the response-position mask ``[B, T]`` and their targets.

    With top states in the samples, also ``top`` ``[B, T, H]``: row t holds the last-layer state
    at t - 1 (zeros at t = 0), and ``top_target`` ``[n, H]``: the state at each response position.
    """
    chosen = [samples[i] for i in index]
    longest = max(len(s.hidden) for s in chosen)
    size = chosen[0].hidden.shape[1]
    hidden = torch.zeros(len(chosen), longest, size)
    mask = torch.zeros(len(chosen), longest, dtype=torch.bool)
    with_top = chosen[0].top is not None
    top = torch.zeros(len(chosen), longest, size) if with_top else None
    for b, s in enumerate(chosen):
        hidden[b, : len(s.hidden)] = s.hidden.float()
        mask[b, s.prompt_length - 1 : len(s.hidden)] = True
        if top is not None:
            if s.top is None:
                raise ConfigError(
                    "Some samples have top states and others not: read all with the same layers."
                )
            top[b, 1 : len(s.top)] = s.top[:-1].float()
    ids = torch.cat([s.topk_ids.long() for s in chosen])  # [n, K]
    if vocab_map is not None:
        ids = vocab_map[ids]
    logprobs = torch.cat([s.topk_logprobs.float() for s in chosen])
    batch = {"hidden": hidden, "mask": mask, "ids": ids, "logprobs": logprobs}
    if top is not None:
        batch["top"] = top
        batch["top_target"] = torch.cat(
            [s.top[s.prompt_length - 1 :].float() for s in chosen if s.top is not None]
        )
    return batch


def distill_loss(
    logits: torch.Tensor, ids: torch.Tensor, logprobs: torch.Tensor, ce_weight: float
) -> torch.Tensor:
    """KL(p || q) over the teacher's top-k (ids of -1 lie outside the head's vocabulary)."""
    inside = ids >= 0
    p = logprobs.exp() * inside
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
    logq = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.clamp_min(0))  # [n, K]
    kl = (p * (p.clamp_min(1e-12).log() - logq)).sum(-1).mean()
    if ce_weight and bool(inside[:, 0].any()):
        kl = kl - ce_weight * logq[:, 0][inside[:, 0]].mean()
    return kl


def head_logits(head: Any, lm_weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Logits over the head's own vocabulary (the subset, if any) for states ``[n, H]``."""
    return head.adapter.logits(head.norm(hidden), lm_weight)


def forward(head: Any, lm_weight: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Exit layers over whole sequences; logits at response positions only ``[n, V]``."""
    return forward_states(head, lm_weight, batch)[0]


def forward_states(
    head: Any, lm_weight: torch.Tensor, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[n, V]`` and the head's output states ``[n, H]`` at response positions."""
    top = batch.get("top")
    if top is not None:
        with torch.no_grad():
            top = head.top_state(top)
    out = head.hidden(batch["hidden"], 0, head.new_cache(), None, top)  # [B, T, H]
    picked = out[batch["mask"]]
    return head_logits(head, lm_weight, picked), picked


def top_loss(head: Any, states: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Smooth-L1 distance of the head's normalised output to the target's normalised top state."""
    with torch.no_grad():
        target = head.top_state(batch["top_target"])
    return F.smooth_l1_loss(head.top_state(states), target)


def frozen_lm_weight(head: Any) -> torch.Tensor:
    weight = head.subset_head.weight if head.subset_head is not None else head.adapter.lm_head_weight
    return weight.detach().float()


def vocab_map(head: Any) -> torch.Tensor | None:
    """Full-vocabulary id -> index in the head's subset, -1 outside it (None without a subset)."""
    if head.vocab_ids is None:
        return None
    mapping = torch.full((head.adapter.vocab_size,), -1, dtype=torch.long)
    mapping[head.vocab_ids.cpu()] = torch.arange(len(head.vocab_ids))
    return mapping


def lr_at(step: int, total: int, settings: TrainSettings) -> float:
    """Linear warm-up, then cosine decay to zero."""
    warm = max(1, int(total * settings.warmup))
    return settings.lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total)))


def train_head(
    head: Any,
    samples: list[Sample],
    settings: TrainSettings,
    checkpoint: Path | None = None,
    resume: bool = False,
    progress: bool = True,
    max_steps: int | None = None,
) -> TrainResult:
    """Train ``head`` (float32, in place) on ``samples``; resumable from ``checkpoint``."""
    target = [p for p in head.adapter.model.parameters() if p.requires_grad]
    for p in target:  # the target is frozen: no gradient piles up in it
        p.requires_grad_(False)
    try:
        return _train(head, samples, settings, checkpoint, resume, progress, max_steps)
    finally:
        for p in target:
            p.requires_grad_(True)


def _train(
    head: Any,
    samples: list[Sample],
    settings: TrainSettings,
    checkpoint: Path | None,
    resume: bool,
    progress: bool,
    max_steps: int | None,
) -> TrainResult:
    from tqdm.auto import tqdm

    params = [p for name, p in head.named_parameters() if not name.startswith("subset_head")]
    if head.subset_head is not None:
        head.subset_head.requires_grad_(False)
    if settings.top_weight and not head.top_input:
        raise ConfigError("--top-weight trains the stand-in of a top-input head: add --top-input.")
    if head.top_input and samples and samples[0].top is None:
        raise ConfigError("A top-input head needs data read with the last layer's states.")
    opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay)
    per_epoch = len(batches(samples, settings.batch_tokens, None))
    total = per_epoch * settings.epochs
    identity = _identity(head, samples, settings)
    step = load_checkpoint(checkpoint, head, opt, identity) if resume and checkpoint else 0
    lm_weight, mapping = frozen_lm_weight(head), vocab_map(head)
    result, started = TrainResult(step, 0.0), time.perf_counter()
    stop = total if max_steps is None else min(total, max_steps)
    head.train()
    bar = tqdm(total=stop, initial=step, desc="train", unit="step", disable=not progress)
    for epoch in range(step // per_epoch, settings.epochs):
        order = batches(samples, settings.batch_tokens, torch.Generator().manual_seed(settings.seed + epoch))
        for index in order[step - epoch * per_epoch :]:
            if step >= stop:
                break
            batch = {name: t.to(lm_weight.device) for name, t in collate(samples, index, mapping).items()}
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total, settings)
            logits, states = forward_states(head, lm_weight, batch)
            loss = distill_loss(logits, batch["ids"], batch["logprobs"], settings.ce_weight)
            if settings.top_weight:
                loss = loss + settings.top_weight * top_loss(head, states, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
            opt.step()
            step += 1
            result.losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{result.final_loss:.4f}", epoch=epoch)
            if checkpoint and settings.checkpoint_every and step % settings.checkpoint_every == 0:
                save_checkpoint(checkpoint, head, opt, step, identity)
    bar.close()
    head.eval()
    if checkpoint and step > result.steps:
        save_checkpoint(checkpoint, head, opt, step, identity)
    result.steps, result.seconds = step, time.perf_counter() - started
    return result


def _identity(head: Any, samples: list[Sample], settings: TrainSettings) -> str:
    """What a checkpoint must agree on to be resumed: settings, data size, head shape, subset."""
    vocab = None if head.vocab_ids is None else head.vocab_ids.tolist()
    blob = json.dumps(
        {
            "settings": {k: v for k, v in asdict(settings).items() if k != "checkpoint_every"},
            "samples": len(samples),
            "positions": sum(len(s.response) for s in samples),
            "exit_layer": head.exit_layer,
            "top_input": head.top_input,
            "head_layers": head.num_layers,
            "mlp_width": getattr(head, "mlp_width", 0),
            "vocab": vocab,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _trainable(head: Any) -> dict[str, torch.Tensor]:
    return {k: v for k, v in head.state_dict().items() if not k.startswith("subset_head")}


def save_checkpoint(path: Path, head: Any, opt: torch.optim.Optimizer, step: int, identity: str) -> None:
    """Written atomically, so an interruption never leaves a half checkpoint behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "identity": identity, "head": _trainable(head), "optimizer": opt.state_dict()}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_checkpoint(path: Path, head: Any, opt: torch.optim.Optimizer, identity: str) -> int:
    """Restore head and optimiser; the step to continue from (0 when there is no checkpoint)."""
    if not path.is_file():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state["identity"] != identity:
        raise ConfigError(
            f"Checkpoint {str(path)!r} was made with other training settings or data; "
            "drop --resume, or delete the checkpoint to start over."
        )
    head.load_state_dict({**head.state_dict(), **state["head"]})
    opt.load_state_dict(state["optimizer"])
    return int(state["step"])
