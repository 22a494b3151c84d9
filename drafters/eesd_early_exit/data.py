"""Distillation data: the frozen target answers prompts, and we keep what the exit head learns from.

Generation is batched (left padding, one shared cache, positions per row; rows that are done leave
the batch). At every position it keeps the layer-N hidden state h_N, the exit head's input, and at
every position that predicts a response token the teacher's top-k log-probabilities of the final
layer. It can keep the states after other layers too (``extra_layers``): one generation then serves
a sweep over N, and the states after the last layer (before the final norm) feed a head with the
top-state input. Both come out of the forward passes that generate the text, so the data costs no
more than generating it. Prompt positions keep h_N too: they are the context the exit layer attends
to, as its KV cache does at decode time.

Each batch of prompts becomes one safetensors shard, written atomically; a shard that exists with
the same settings is skipped, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eesd_core.errors import ConfigError
from eesd_core.protocols import ModelAdapter


@dataclass(frozen=True)
class CaptureSettings:
    """What a shard depends on; a work directory holds data of one setting only.

    The states after ``exit_layer`` and each of ``extra_layers`` are kept (``num_layers``: after the
    last layer, before the final norm). A shard that holds more layers than asked serves as well.
    """

    exit_layer: int
    max_new_tokens: int
    top_k: int = 64
    temperature: float = 0.0
    batch_size: int = 16
    seed: int = 0
    extra_layers: tuple[int, ...] = ()

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted({self.exit_layer, *self.extra_layers}))

    def key(self) -> str:
        """The settings that must match exactly; the layers need only be among a shard's."""
        fields = {k: v for k, v in asdict(self).items() if k not in ("exit_layer", "extra_layers")}
        return json.dumps(fields, sort_keys=True)


@dataclass
class Sample:
    """One prompt and its response. ``hidden``: h_N ``[plen + R - 1, H]``; top-k: ``[R, K]``.

    ``top``, when read: the states after the last layer at the same positions ``[plen + R - 1, H]``.
    ``layers``: the states after each captured layer, as generated (``read_shards`` picks two).
    """

    tokens: torch.Tensor
    prompt_length: int
    hidden: torch.Tensor
    topk_logprobs: torch.Tensor
    topk_ids: torch.Tensor
    top: torch.Tensor | None = None
    layers: dict[int, torch.Tensor] | None = None

    @property
    def response(self) -> torch.Tensor:
        return self.tokens[self.prompt_length :]


def generate_shards(
    adapter: ModelAdapter,
    prompts: list[list[int]],
    work_dir: str | Path,
    settings: CaptureSettings,
    eos_ids: list[int],
    progress: bool = True,
    fingerprint: str = "",
) -> list[Path]:
    """Generate (or find) every shard for ``prompts``; returns the shard paths in order.

    Shards follow the prompts' own order, so asking for more prompts later reuses every full shard
    already made for the first ones.
    """
    from tqdm.auto import tqdm

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    chunks = [prompts[i : i + settings.batch_size] for i in range(0, len(prompts), settings.batch_size)]
    paths = []
    bar = tqdm(chunks, desc="generate", unit="batch", disable=not progress)
    for index, batch in enumerate(bar):
        meta = _shard_metadata(settings, batch, fingerprint)
        path = work_dir / f"shard-{index:05d}.safetensors"
        missing = _missing_layers(path, meta)
        if missing:
            bar.set_description("add layers")
            add_layers(adapter, path, missing)
        elif missing is None:
            generator = torch.Generator().manual_seed(settings.seed * 100_003 + index)
            samples = capture_batch(adapter, batch, settings, eos_ids, generator)
            write_shard(path, samples, meta)
        paths.append(path)
    return paths


def _shard_metadata(settings: CaptureSettings, batch: list[list[int]], fingerprint: str) -> dict[str, str]:
    digest = hashlib.sha256(json.dumps(batch).encode()).hexdigest()[:32]
    return {
        "settings": settings.key(),
        "layers": json.dumps(list(settings.layers)),
        "prompts": digest,
        "target": fingerprint,
    }


def _missing_layers(path: Path, meta: dict[str, str]) -> list[int] | None:
    """For a shard of these prompts, the layers it lacks ([] when it serves as it is); ``None``
    when there is no such shard yet (one of other prompts is stale and made again)."""
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        found = f.metadata() or {}
    if any(found.get(key) != meta[key] for key in ("settings", "target")):
        raise ConfigError(
            f"{str(path)!r} holds data generated with other settings or another target. "
            "Use another work directory, or delete this one to regenerate."
        )
    if found.get("prompts") != meta["prompts"]:
        return None
    held, needed = json.loads(found.get("layers", "[]")), json.loads(meta["layers"])
    return sorted(set(needed) - set(held))


@torch.no_grad()
def add_layers(adapter: ModelAdapter, path: str | Path, layers: list[int]) -> None:
    """Add the states after ``layers`` to a shard that lacks them, by one teacher-forced pass of the
    target's first ``max(layers)`` layers over each stored prompt and response.

    The tokens were chosen when the shard was generated, so this costs a prefill of each sequence
    through those layers, a small part of generating it: a sweep over the exit layer N needs one
    generation only. The new states equal those kept at generation time up to the rounding of a
    pass over many positions instead of one (and of batch padding). The shard is rewritten
    atomically with its metadata's ``layers`` extended."""
    path = Path(path)
    _check_layers(adapter, tuple(layers))
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    held = json.loads(meta.get("layers", "[]"))
    layers = sorted(set(layers) - set(held))
    if not layers:
        return
    kept: dict[int, list[torch.Tensor]] = {n: [] for n in layers}
    tok = 0
    for plen, r in zip(tensors["prompt_lengths"].tolist(), tensors["response_lengths"].tolist(), strict=True):
        ids = tensors["tokens"][tok : tok + plen + r - 1].to(adapter.device)
        tok += plen + r
        cache = adapter.new_cache(capacity=len(ids))
        x, done = adapter.embed(ids), 0
        rotary = adapter.rotary(x, 0)
        for n in layers:
            x = adapter.run(x, done, n, cache, 0, None, rotary)
            kept[n].append(x[0])
            done = n
    like = next(v for k, v in tensors.items() if k.startswith("hidden."))
    for n in layers:
        tensors[f"hidden.{n}"] = torch.cat(kept[n]).to(like.dtype).cpu()
    meta["layers"] = json.dumps(sorted({*held, *layers}))
    _write_atomic(path, tensors, meta)


@torch.no_grad()
def capture_batch(
    adapter: ModelAdapter,
    prompts: list[list[int]],
    settings: CaptureSettings,
    eos_ids: list[int],
    generator: torch.Generator,
) -> list[Sample]:
    """Generate responses to ``prompts`` together, keeping the states after ``settings.layers`` and
    the teacher's top-k per position. ``Sample.hidden`` is h_N; ``Sample.layers`` holds them all.

    Rows that reached an EOS leave the batch (with their cache rows) once they are an eighth of it,
    so a batch costs what its live rows cost, not what its longest response costs.
    """
    device = adapter.device
    batch, longest = len(prompts), max(len(p) for p in prompts)
    total, steps_max = longest + settings.max_new_tokens, settings.max_new_tokens
    ids = torch.zeros(batch, longest, dtype=torch.long, device=device)
    valid = torch.zeros(batch, total, dtype=torch.bool, device=device)
    for b, prompt in enumerate(prompts):
        ids[b, longest - len(prompt) :] = torch.tensor(prompt, device=device)
        valid[b, longest - len(prompt) : longest] = True
    positions = (valid[:, :longest].long().cumsum(1) - 1).clamp_min(0)  # [B, P]
    cache = adapter.new_cache(capacity=total)
    layers = settings.layers
    _check_layers(adapter, layers)
    prefill, logits = _forward(adapter, ids, positions, valid[:, :longest], cache, layers)
    hidden_size, positions = prefill.shape[-1], positions[:, -1:]
    states = prefill.new_zeros(len(layers), batch, max(steps_max - 1, 0), hidden_size)
    values = torch.zeros(batch, steps_max, settings.top_k, device=device)
    indices = torch.zeros(batch, steps_max, settings.top_k, dtype=torch.long, device=device)
    steps = torch.zeros(batch, steps_max, dtype=torch.long, device=device)
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    rows = torch.arange(batch, device=device)  # the batch row of each live row
    taken = 0
    for t in range(steps_max):
        top = torch.log_softmax(logits.float(), dim=-1).topk(settings.top_k, dim=-1)
        values[rows, t], indices[rows, t] = top.values, top.indices
        token = _choose(logits, settings.temperature, generator)  # [live]
        steps[rows, t] = token
        taken = t + 1
        done[rows] |= torch.isin(token, eos)
        if bool(done.all()) or t == steps_max - 1:
            break
        live = ~done[rows]
        if int((~live).sum()) * 8 >= len(rows):
            keep = live.nonzero()[:, 0]
            rows, token, positions, valid = rows[keep], token[keep], positions[keep], valid[keep]
            keep_rows(cache, keep)
        valid[:, longest + t] = True
        h, logits = _forward(
            adapter, token.view(-1, 1), positions + 1 + t, valid[:, : longest + t + 1], cache, layers
        )
        states[:, rows, t] = h[:, :, 0]
    states = torch.cat([prefill, states[:, :, : taken - 1]], 2)  # [len(layers), B, T, H]
    return _split(
        prompts, states, values, indices, steps[:, :taken], eos_ids, longest, layers, settings.exit_layer
    )


def _check_layers(adapter: Any, layers: tuple[int, ...]) -> None:
    bad = [n for n in layers if not 1 <= n <= adapter.num_layers]
    if bad:
        raise ConfigError(
            f"Cannot keep the states after layers {bad}: this model has layers 1..{adapter.num_layers}."
        )


def _forward(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    positions: torch.Tensor,
    valid: torch.Tensor,
    cache: Any,
    layers: tuple[int, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """All layers over ``ids`` ``[B, m]``: the states after ``layers`` ``[len(layers), B, m, H]``
    and the last column's logits."""
    x = adapter.embed(ids)  # [B, m, H]
    rotary = adapter.rotary(x, positions)
    kept, done = [], 0
    for end in (*layers, adapter.num_layers):
        x = adapter.run(x, done, end, cache, positions, valid, rotary)
        kept.append(x)
        done = end
    return torch.stack(kept[: len(layers)]), adapter.logits(adapter.norm(x[:, -1]))


def keep_rows(cache: Any, rows: torch.Tensor) -> None:
    """Keep only batch rows ``rows`` of every layer of ``cache``: drop sequences that are done."""
    for layer in range(cache.num_layers):
        keys, values = cache.keys[layer], cache.values[layer]
        if keys is not None and values is not None:
            cache.keys[layer] = keys.index_select(0, rows.to(keys.device))
            cache.values[layer] = values.index_select(0, rows.to(values.device))


def _choose(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """Greedy, or one draw per row by inverting the CDF with one uniform (cheaper than multinomial)."""
    if temperature <= 0:
        return logits.argmax(-1)
    cdf = torch.softmax(logits.float() / temperature, dim=-1).cpu().cumsum(-1)
    u = torch.rand(cdf.shape[0], 1, generator=generator, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_max(cdf.shape[1] - 1)[:, 0].to(logits.device)


def _split(
    prompts: list[list[int]],
    states: torch.Tensor,
    values: torch.Tensor,
    indices: torch.Tensor,
    steps: torch.Tensor,
    eos_ids: list[int],
    longest: int,
    layers: tuple[int, ...],
    exit_layer: int,
) -> list[Sample]:
    """Cut the batch into samples: each row up to its first EOS, without the left padding."""
    by_layer = {n: _compact(states[i]) for i, n in enumerate(layers)}
    samples = []
    for b, prompt in enumerate(prompts):
        response = steps[b].tolist()
        for i, token in enumerate(response):
            if token in eos_ids:
                response = response[: i + 1]
                break
        plen, r = len(prompt), len(response)
        kept = {n: h[b, longest - plen : longest + r - 1] for n, h in by_layer.items()}
        samples.append(
            Sample(
                tokens=torch.tensor(prompt + response, dtype=torch.long),
                prompt_length=plen,
                hidden=kept[exit_layer],
                topk_logprobs=values[b, :r].half().cpu(),
                topk_ids=indices[b, :r].int().cpu(),
                layers=kept,
            )
        )
    return samples


def _compact(h: torch.Tensor) -> torch.Tensor:
    """float16 halves the disk; bfloat16 instead for the rare model whose states overflow it."""
    h = h.detach().cpu()
    return h.half() if float(h.abs().max()) < 6e4 else h.bfloat16()


def write_shard(path: Path, samples: list[Sample], metadata: dict[str, str]) -> None:
    """One shard: the samples' tensors concatenated, with their lengths to cut them apart again."""
    layers = samples[0].layers or {}
    tensors = {
        "tokens": torch.cat([s.tokens for s in samples]),
        "prompt_lengths": torch.tensor([s.prompt_length for s in samples]),
        "response_lengths": torch.tensor([len(s.response) for s in samples]),
        "topk_logprobs": torch.cat([s.topk_logprobs for s in samples]),
        "topk_ids": torch.cat([s.topk_ids for s in samples]),
    }
    for n in layers:
        tensors[f"hidden.{n}"] = torch.cat([s.layers[n] for s in samples if s.layers is not None])
    _write_atomic(path, tensors, metadata)


def _write_atomic(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=metadata)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def shard_layers(path: str | Path) -> list[int]:
    """The layers whose states a shard holds."""
    with safe_open(str(path), framework="pt") as f:
        return sorted(int(name.split(".", 1)[1]) for name in f.keys() if name.startswith("hidden."))  # noqa: SIM118


def read_shard(path: str | Path, layer: int | None = None, top_layer: int | None = None) -> list[Sample]:
    """The samples of a shard, with ``hidden`` the states after ``layer`` (default: the shard's
    only layer) and ``top`` those after ``top_layer`` if given."""
    held = shard_layers(path)
    if layer is None:
        if len(held) != 1:
            raise ConfigError(f"{str(path)!r} holds the states of layers {held}: say which to read.")
        layer = held[0]
    for wanted in (layer, top_layer):
        if wanted is not None and wanted not in held:
            raise ConfigError(
                f"{str(path)!r} holds the states of layers {held}, not of layer {wanted}: generate "
                "the data again with that layer among --capture-layers."
            )
    names = {"tokens", "prompt_lengths", "response_lengths", "topk_logprobs", "topk_ids"}
    with safe_open(str(path), framework="pt") as f:
        t = {name: f.get_tensor(name) for name in names}
        t["hidden"] = f.get_tensor(f"hidden.{layer}")
        if top_layer is not None:
            t["top"] = f.get_tensor(f"hidden.{top_layer}")
    samples, tok, row, top = [], 0, 0, 0
    for plen, r in zip(t["prompt_lengths"].tolist(), t["response_lengths"].tolist(), strict=True):
        rows = plen + r - 1
        samples.append(
            Sample(
                tokens=t["tokens"][tok : tok + plen + r],
                prompt_length=plen,
                hidden=t["hidden"][row : row + rows],
                topk_logprobs=t["topk_logprobs"][top : top + r],
                topk_ids=t["topk_ids"][top : top + r],
                top=t["top"][row : row + rows] if "top" in t else None,
            )
        )
        tok, row, top = tok + plen + r, row + rows, top + r
    return samples


def read_shards(paths: list[Path], layer: int | None = None, top_layer: int | None = None) -> list[Sample]:
    return [sample for path in paths for sample in read_shard(path, layer, top_layer)]


def rank_vocab(samples: list[Sample], vocab_size: int, size: int, keep: list[int]) -> torch.Tensor:
    """The ``size`` token ids with the most teacher mass, sorted; ``keep`` (EOS) always included.

    Mass is the argmax count plus 0.1 x the summed top-k probabilities: with little data argmax
    counts alone see a few thousand distinct tokens and rank the rest arbitrarily, while the soft
    mass covers more of what the target says on unseen prompts.
    """
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for s in samples:
        ids = s.topk_ids.long()
        mass += torch.bincount(ids[:, 0], minlength=vocab_size).double()
        mass.index_add_(0, ids.reshape(-1), 0.1 * s.topk_logprobs.double().exp().reshape(-1))
    mass[torch.tensor(keep, dtype=torch.long)] = float("inf")
    chosen = mass.argsort(descending=True)[: min(size, vocab_size)]
    return chosen.sort().values
