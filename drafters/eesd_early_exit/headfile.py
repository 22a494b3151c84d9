"""Exit-head files: safetensors with metadata that ties a head to the target it was distilled from.

Metadata (all strings, as safetensors requires): ``format`` (``eesd-exit-head``), ``format_version``,
``architecture`` (model_type), ``hidden_size``, ``vocab_size``, ``num_target_layers``,
``fingerprint`` (of the target's weights), ``exit_layer``, ``num_exit_layers``, ``init_layer``,
``mlp_width`` (of the head's layers; absent in older files, whose layers are the target's width),
``vocab_subset`` (number of tokens, 0 for the full vocabulary), ``exit_input`` (``hidden`` for the
paper's head on h_N, ``hidden+top`` for a head that also reads the target's top state; absent in
older files, which are ``hidden``), ``storage`` (``float``, or ``int8``: each matrix stored as int8
with a float32 scale per output row, ``NAME.scale``, which halves a bfloat16 file; absent in older
files, which are ``float``), ``training`` (JSON) and
``tensors_sha256`` (of every tensor's name, dtype, shape and bytes, as stored). Loading checks
every field, and the tensors the header declares, against the target before any tensor is read or
any module built (:mod:`eesd_early_exit.headcheck`), then the tensors against their checksum, so a
file damaged or forged after it was written is refused rather than used; writing is atomic.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eesd_core.errors import HeadError
from eesd_core.protocols import ModelAdapter
from eesd_early_exit.headcheck import (
    REDISTIL,
    HeadSpec,
    check_fields,
    check_tensors,
    check_vocab_ids,
    head_spec,
    shown,
)

FORMAT = "eesd-exit-head"
FORMAT_VERSION = 1
EXIT_INPUTS = ("hidden", "hidden+top")
STORAGES = ("float", "int8")
SCALE = ".scale"


SHIPPED_HEADS = Path(__file__).parent / "heads"


def fingerprint(model: torch.nn.Module) -> str:
    """A stable hash of a model's weights: names, shapes and a strided sample of values.

    Values are hashed as bfloat16 bits, so a float32 checkpoint and its bfloat16 copy share a
    fingerprint (a head distilled on one fits the other) while any other model does not.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if not tensor.is_floating_point():
            continue
        flat = tensor.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 1024)][:1024].to(torch.bfloat16)
        digest.update(f"{name}:{tuple(tensor.shape)}:".encode())
        digest.update(sample.view(torch.int16).cpu().numpy().tobytes())
    return digest.hexdigest()[:32]


def find_shipped_head(adapter: ModelAdapter) -> Path | None:
    """The head shipped with eesd for this exact target, if there is one."""
    model = getattr(adapter, "model", None)
    if not SHIPPED_HEADS.is_dir() or not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        return None  # heads are shipped for Hugging Face models only
    shape = describe_target(adapter, with_fingerprint=False)
    candidates = []
    for path in sorted(SHIPPED_HEADS.glob("*.safetensors")):
        try:
            metadata = read_metadata(path)
        except HeadError:
            continue
        if all(metadata.get(key) == value for key, value in shape.items()):
            candidates.append((path, metadata))
    if not candidates:
        return None
    weights = fingerprint(model)  # hashed only when a head of the right shape exists
    return next((path for path, metadata in candidates if metadata.get("fingerprint") == weights), None)


def describe_target(adapter: ModelAdapter, with_fingerprint: bool = True) -> dict[str, str]:
    described = {
        "architecture": adapter.model_type,
        "hidden_size": str(adapter.hidden_size),
        "vocab_size": str(adapter.vocab_size),
        "num_target_layers": str(adapter.num_layers),
    }
    if with_fingerprint:
        described["fingerprint"] = fingerprint(adapter.model)
    return described


def save_head(
    head: Any,
    adapter: ModelAdapter,
    path: str | Path,
    training: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "float",
) -> Path:
    """Write ``head`` atomically: a temporary file in the same directory, then a rename. Tensors in
    ``dtype``; with ``storage="int8"`` its matrices in int8 with a scale per row instead."""
    if storage not in STORAGES:
        raise HeadError(f"Unknown head storage {storage!r}: one of {', '.join(STORAGES)}.")
    if head.vocab_ids is not None and not len(head.vocab_ids):
        raise HeadError("An exit head with an empty vocabulary subset drafts nothing: give it some tokens.")
    path = Path(path)
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        **describe_target(adapter),
        "exit_layer": str(head.exit_layer),
        "num_exit_layers": str(head.num_layers),
        "mlp_width": str(getattr(head, "mlp_width", 0)),
        "init_layer": str(getattr(head, "init_layer", -1)),
        "vocab_subset": str(0 if head.vocab_ids is None else len(head.vocab_ids)),
        "exit_input": "hidden+top" if head.top_input else "hidden",
        "storage": storage,
        "training": json.dumps(training or {}, sort_keys=True),
    }
    tensors: dict[str, torch.Tensor] = {}
    for name, value in head.trainable_state().items():
        if storage == "int8" and value.dim() == 2:
            tensors[name], tensors[name + SCALE] = quantize_rows(value.detach().cpu())
        else:
            tensors[name] = value.detach().to(dtype).contiguous().cpu()
    if head.vocab_ids is not None:
        tensors["vocab_ids"] = head.vocab_ids.detach().to(torch.int64).cpu().contiguous()
    metadata["tensors_sha256"] = tensors_digest(tensors)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a head file is meant to be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one float32 scale per row: (int8 ``[R, C]``, scales ``[R]``); a row
    dequantizes to ``q * scale``, within half a step (scale / 2) of every weight."""
    w = weight.double()
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-30)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.float().contiguous()


def dequantize(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Float tensors from a file's tensors: each int8 matrix times its row scales."""
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(SCALE):
            continue
        scale = tensors.get(name + SCALE)
        out[name] = tensor if scale is None else tensor.float() * scale.float()[:, None]
    return out


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors' names, dtypes, shapes and raw bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}:".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def read_metadata(path: str | Path) -> dict[str, str]:
    """The metadata of a head file, each field in the form the loader reads, or a
    :class:`HeadError` saying why it is not one."""
    with _opened(Path(path)) as f:
        return _checked_metadata(f.metadata() or {}, path)


@contextmanager
def _opened(path: Path) -> Iterator[Any]:
    """``path`` opened by ``safe_open`` (which reads its header alone), or a :class:`HeadError`."""
    if path.is_dir():
        raise HeadError(
            f"Exit-head path {str(path)!r} is a directory; expected a .safetensors exit-head file. "
            "Give the path of the file itself."
        )
    if not path.is_file():
        raise HeadError(
            f"Exit-head file {str(path)!r} does not exist. Check the path, or distil one with `eesd distill`."
        )
    try:
        opened = safe_open(str(path), framework="pt")
    except Exception as exc:
        raise HeadError(
            f"{str(path)!r} is not a readable safetensors file ({exc}); it may be truncated or "
            f"corrupted. {REDISTIL}"
        ) from None
    with opened as f:
        yield f


def _checked_metadata(metadata: dict[str, str], path: str | Path) -> dict[str, str]:
    if metadata.get("format") != FORMAT:
        raise HeadError(
            f"{str(path)!r} is not an eesd exit-head file (metadata format={shown(metadata.get('format'))})."
        )
    version = metadata.get("format_version")
    if version != str(FORMAT_VERSION):
        raise HeadError(
            f"{str(path)!r} has head format version {shown(version)} (its format_version), this eesd reads "
            f"{FORMAT_VERSION}. Upgrade eesd or re-distil the head."
        )
    if metadata.get("exit_input", "hidden") not in EXIT_INPUTS:
        raise HeadError(
            f"{str(path)!r} needs an exit input this eesd does not know "
            f"(its exit_input is {shown(metadata.get('exit_input'))}; known: {', '.join(EXIT_INPUTS)}). "
            "Upgrade eesd."
        )
    storage = metadata.get("storage", "float")
    if storage not in STORAGES:
        raise HeadError(
            f"{str(path)!r} stores its weights as {shown(storage)} (its storage), which this eesd cannot "
            f"read (known: {', '.join(STORAGES)}). Upgrade eesd."
        )
    check_fields(metadata, path)
    return metadata


def check_target(metadata: dict[str, str], adapter: ModelAdapter, path: str | Path) -> None:
    """Refuse a head distilled from another model."""
    expected = describe_target(adapter)
    for key in ("architecture", "hidden_size", "vocab_size", "num_target_layers", "fingerprint"):
        if metadata.get(key) != expected[key]:
            raise HeadError(
                f"Exit head {str(path)!r} was distilled for another model: its {key} is "
                f"{shown(metadata.get(key))}, the target's is {expected[key]!r}. Use the head made for "
                "this checkpoint, or distil one with `eesd distill`."
            )


def check_head(path: str | Path, adapter: ModelAdapter) -> HeadSpec:
    """The spec of the head in ``path`` once its metadata and the tensors its header declares fit
    ``adapter``; nothing is read but the header, nothing is built."""
    with _opened(Path(path)) as f:
        return _checked_head(f, path, adapter)[1]


def _checked_head(f: Any, path: str | Path, adapter: ModelAdapter) -> tuple[dict[str, str], HeadSpec]:
    metadata = _checked_metadata(f.metadata() or {}, path)
    check_target(metadata, adapter, path)
    spec = head_spec(metadata, adapter, path)
    try:
        declared = {}
        for name in f.keys():  # noqa: SIM118
            view = f.get_slice(name)
            declared[name] = (tuple(view.get_shape()), view.get_dtype())
    except Exception as exc:
        raise HeadError(
            f"Exit head {str(path)!r} could not be read ({exc}); it may be truncated or corrupted. {REDISTIL}"
        ) from None
    check_tensors(declared, spec, adapter, path)
    return metadata, spec


def load_head(path: str | Path, adapter: ModelAdapter) -> Any:
    """Build an :class:`~eesd_early_exit.head.ExitHead` from a head file, read once it passed the
    checks of :func:`check_head`; the tensors come from the same open file as the header checked."""
    from eesd_early_exit.head import ExitHead

    with _opened(Path(path)) as f:
        metadata, spec = _checked_head(f, path, adapter)
        try:
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        except Exception as exc:
            raise HeadError(
                f"Exit head {str(path)!r} could not be read ({exc}); it may be truncated or corrupted. "
                f"{REDISTIL}"
            ) from None
    if metadata["tensors_sha256"] != tensors_digest(tensors):
        raise HeadError(
            f"Exit head {str(path)!r} is corrupted: its tensors do not match the checksum in its "
            f"metadata (tensors_sha256). {REDISTIL}"
        )
    vocab_ids = tensors.pop("vocab_ids", None)
    if vocab_ids is not None:
        check_vocab_ids(vocab_ids, adapter.vocab_size, path)
    try:
        if spec.storage == "int8":
            tensors = dequantize(tensors)
        head = ExitHead(
            adapter,
            spec.exit_layer,
            spec.num_layers,
            init_layer=spec.init_layer,
            vocab_ids=vocab_ids,
            top_input=spec.top_input,
            mlp_width=spec.mlp_width or None,
        )
        dtype = adapter.dtype
        missing, unexpected = head.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=False)
        missing = [k for k in missing if not k.startswith("subset_head.")]
        if missing or unexpected:
            raise ValueError(f"missing tensors {missing}, unexpected tensors {unexpected}")
    except Exception as exc:
        raise HeadError(f"Exit head {str(path)!r} does not match its metadata: {exc}. {REDISTIL}") from None
    return head.to(adapter.device).eval()
