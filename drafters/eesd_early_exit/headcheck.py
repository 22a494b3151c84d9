"""What a head file must hold to load on a target, checked from its header before anything is built.

A head file comes from elsewhere: a download, a colleague, a disk that failed. Every metadata field
the loader relies on is checked for its form (:func:`check_fields`, no target needed), then against
the target (:func:`head_spec`), and every tensor the header declares against the names, shapes and
dtypes a head of that spec has on that target (:func:`check_tensors`). So a damaged or hostile file
is refused with the file and the field it got wrong, and nothing is allocated for it: a forged layer
count builds no layers, a forged width or vocabulary reads no tensor.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eesd_core.errors import HeadError
from eesd_core.protocols import ModelAdapter

REDISTIL = "Re-download or re-distil the head."
ANOTHER_MODEL = "Use the head made for this checkpoint, or distil one with `eesd distill`."

#: integer fields and their least values; absent ones default to ``DEFAULTS``, save ``vocab_subset``
#: (then the file's ``vocab_ids`` alone say the subset)
INTEGERS = {"exit_layer": 1, "num_exit_layers": 0, "init_layer": -1, "mlp_width": 0, "vocab_subset": 0}
REQUIRED = ("exit_layer", "num_exit_layers")
DEFAULTS = {"init_layer": "-1", "mlp_width": "0"}
_INTEGER = re.compile(r"-?[0-9]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
FLOATS = ("F16", "BF16", "F32", "F64")
GATED = ("mlp.gate_proj.", "mlp.up_proj.")


@dataclass(frozen=True)
class HeadSpec:
    """A head's shape as its file declares it and the target allows. ``init_layer`` ``None``: the
    target's last layer; ``mlp_width`` 0: the copied layer's full width; ``vocab_subset`` 0: the
    full vocabulary, ``None``: as many tokens as the file's ``vocab_ids`` holds."""

    exit_layer: int
    num_layers: int
    init_layer: int | None
    mlp_width: int
    vocab_subset: int | None
    top_input: bool
    storage: str


def refuse(path: str | Path, field: str, problem: str, advice: str = REDISTIL) -> HeadError:
    """The error for a head file whose ``field`` has ``problem``, naming both."""
    return HeadError(f"Exit head {str(path)!r}: its {field} {problem}. {advice}")


def check_fields(metadata: dict[str, str], path: str | Path) -> None:
    """The form of every field the loader reads: whole numbers where numbers belong, the checksum a
    sha256, the training record JSON. Bounds that depend on the target come in :func:`head_spec`."""
    for field, least in INTEGERS.items():
        text = metadata.get(field)
        if text is None and field in REQUIRED:
            raise refuse(path, field, "is missing from its metadata")
        if text is None:
            continue
        if not _INTEGER.fullmatch(text):
            raise refuse(path, field, f"is {shown(text)}, not a whole number")
        if len(text) > 18:
            raise refuse(path, field, f"is {shown(text)}, beyond any bound a head could have")
        if int(text) < least:
            raise refuse(path, field, f"is {text}, below its least value {least}")
    checksum = metadata.get("tensors_sha256")
    if checksum is None or not _SHA256.fullmatch(checksum):
        raise refuse(path, "tensors_sha256", f"is {shown(checksum)}, not a sha256 hex digest")
    try:
        training = json.loads(metadata.get("training", "{}"))
    except (ValueError, RecursionError):
        training = None
    if not isinstance(training, dict):
        raise refuse(path, "training", "is not a JSON object")


def integer(metadata: dict[str, str], field: str) -> int:
    """An integer field that :func:`check_fields` passed, or its default where absent."""
    return int(metadata.get(field, DEFAULTS.get(field, "0")))


def head_spec(metadata: dict[str, str], adapter: ModelAdapter, path: str | Path) -> HeadSpec:
    """The head's settings, each within what the target allows."""
    layers = adapter.num_layers
    exit_layer = integer(metadata, "exit_layer")
    if exit_layer >= layers:
        raise HeadError(
            f"Exit head {str(path)!r} was made for a deeper model: its exit_layer is {exit_layer}, but "
            f"the target has {layers} layers (an exit layer is 1 to {layers - 1}). {ANOTHER_MODEL}"
        )
    num_layers = integer(metadata, "num_exit_layers")
    if num_layers > layers:
        raise refuse(
            path,
            "num_exit_layers",
            f"is {num_layers}, more than the target's {layers} layers: a head "
            "deeper than its target drafts slower than the target decodes",
        )
    init_layer = integer(metadata, "init_layer")
    if init_layer >= layers:
        raise refuse(path, "init_layer", f"is {init_layer}, but the target's layers are 0 to {layers - 1}")
    vocab_subset = integer(metadata, "vocab_subset") if "vocab_subset" in metadata else None
    if vocab_subset is not None and vocab_subset > adapter.vocab_size:
        raise refuse(path, "vocab_subset", f"is {vocab_subset}, more than the target's {adapter.vocab_size}")
    spec = HeadSpec(
        exit_layer=exit_layer,
        num_layers=num_layers,
        init_layer=None if init_layer < 0 else init_layer,
        mlp_width=integer(metadata, "mlp_width"),
        vocab_subset=vocab_subset,
        top_input=metadata.get("exit_input", "hidden") == "hidden+top",
        storage=metadata.get("storage", "float"),
    )
    if spec.mlp_width and spec.num_layers:
        full = _full_width(adapter, spec, path)
        if spec.mlp_width > full:
            raise refuse(
                path,
                "mlp_width",
                f"is {spec.mlp_width}, wider than the {full} units of the target layer its layers copy",
            )
    return spec


def check_tensors(
    declared: dict[str, tuple[tuple[int, ...], str]], spec: HeadSpec, adapter: ModelAdapter, path: str | Path
) -> None:
    """The tensors a header declares (name: shape, safetensors dtype) are those of a head of ``spec``
    on ``adapter``, with the dtypes its storage writes; ``vocab_ids``, if any, a non-empty vector of
    int64 ids that its ``vocab_subset`` counts."""
    declared = dict(declared)
    _check_vocab_shape(declared.pop("vocab_ids", None), spec, adapter, path)
    expected = _expected(spec, adapter, path)
    missing = sorted(set(expected) - set(declared))
    settings = _settings(spec)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise refuse(path, "tensors", f"lack {', '.join(missing[:3])}{more}, which a head of {settings} has")
    for name, (shape, dtype) in sorted(declared.items()):
        if name not in expected:
            raise refuse(path, f"tensor {name}", f"is not one a head of {settings} has")
        want, dtypes = expected[name]
        if shape != want:
            raise refuse(
                path, f"tensor {name}", f"has shape {list(shape)}; a head of {settings} needs {list(want)}"
            )
        if dtype not in dtypes:
            raise refuse(
                path, f"tensor {name}", f"is {dtype}; a head of {settings} stores {'/'.join(dtypes)}"
            )


def check_vocab_ids(ids: torch.Tensor, vocab_size: int, path: str | Path) -> None:
    """The subset's token ids are distinct ids of the target's vocabulary (its shape and dtype were
    checked from the header)."""
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise refuse(
            path,
            "vocab_ids",
            f"hold token id {low if low < 0 else high}, outside the target's vocabulary of {vocab_size}",
        )
    if int(torch.unique(ids).numel()) != int(ids.numel()):
        raise refuse(path, "vocab_ids", "repeat a token id: a vocabulary subset lists each token once")


def _check_vocab_shape(
    declared: tuple[tuple[int, ...], str] | None, spec: HeadSpec, adapter: ModelAdapter, path: str | Path
) -> None:
    """``vocab_ids``: absent for the full vocabulary, else a non-empty int64 vector of
    ``vocab_subset`` ids (at most the target's vocabulary)."""
    if declared is None:
        if spec.vocab_subset:
            raise refuse(path, "vocab_ids", f"are missing, but its vocab_subset is {spec.vocab_subset}")
        return
    shape, dtype = declared
    if len(shape) != 1 or dtype != "I64":
        raise refuse(path, "vocab_ids", f"are {dtype} of shape {list(shape)}, not a vector of int64 ids")
    if shape[0] == 0:
        raise refuse(path, "vocab_ids", "are empty: a vocabulary subset drafts from at least one token")
    if shape[0] > adapter.vocab_size:
        raise refuse(path, "vocab_ids", f"list {shape[0]} ids, more than the target's {adapter.vocab_size}")
    if spec.vocab_subset is not None and shape[0] != spec.vocab_subset:
        raise refuse(path, "vocab_subset", f"is {spec.vocab_subset}, but its vocab_ids list {shape[0]} ids")


def _expected(spec: HeadSpec, adapter: ModelAdapter, path: str | Path) -> dict[str, Any]:
    """Name: (shape, dtypes) of every tensor a head file of ``spec`` holds besides ``vocab_ids``."""
    layer, norm = _originals(adapter, spec, path)
    shapes = {f"norm.{k}": tuple(v.shape) for k, v in norm.state_dict().items()}
    layer_shapes = {k: tuple(v.shape) for k, v in layer.state_dict().items()} if spec.num_layers else {}
    if spec.mlp_width and spec.num_layers:
        layer_shapes = _narrowed(layer_shapes, spec.mlp_width)
    for index in range(spec.num_layers):
        shapes.update({f"layers.{index}.{k}": shape for k, shape in layer_shapes.items()})
    if spec.top_input:
        shapes["fuse.weight"] = (adapter.hidden_size, 2 * adapter.hidden_size)
    expected: dict[str, Any] = {}
    for name, shape in shapes.items():
        if spec.storage == "int8" and len(shape) == 2:
            expected[name] = (shape, ("I8",))
            expected[name + ".scale"] = ((shape[0],), ("F32",))
        else:
            expected[name] = (shape, FLOATS)
    return expected


def _settings(spec: HeadSpec) -> str:
    """The metadata fields that decide a head's tensors, for a message."""
    exit_input = "hidden+top" if spec.top_input else "hidden"
    init_layer = -1 if spec.init_layer is None else spec.init_layer
    return (
        f"num_exit_layers={spec.num_layers}, mlp_width={spec.mlp_width}, init_layer={init_layer}, "
        f"exit_input={exit_input}, storage={spec.storage}"
    )


def _narrowed(shapes: dict[str, tuple[int, ...]], width: int) -> dict[str, tuple[int, ...]]:
    """A layer's tensor shapes once its gated MLP keeps ``width`` units (see ``narrow_mlp``)."""
    out = {}
    for name, shape in shapes.items():
        if name.startswith(GATED):
            shape = (width, *shape[1:])
        elif name == "mlp.down_proj.weight":
            shape = (shape[0], width)
        out[name] = shape
    return out


def _full_width(adapter: ModelAdapter, spec: HeadSpec, path: str | Path) -> int:
    from eesd_early_exit.head import mlp_width_of

    layer, _ = _originals(adapter, spec, path)
    try:
        return mlp_width_of(layer)
    except ValueError as exc:
        raise refuse(path, "mlp_width", f"is {spec.mlp_width}, but {exc}") from None


def _originals(adapter: ModelAdapter, spec: HeadSpec, path: str | Path) -> tuple[nn.Module, nn.Module]:
    """The target layer a head's layers copy and the target's final norm. Read in place where the
    model has the layout the built-in adapters serve; otherwise copied once, a copy the target
    sizes whatever the file says."""
    source = adapter.num_layers - 1 if spec.init_layer is None else spec.init_layer
    backbone = getattr(getattr(adapter, "model", None), "model", None)
    layers, norm = getattr(backbone, "layers", None), getattr(backbone, "norm", None)
    in_place = isinstance(layers, nn.ModuleList) and len(layers) == adapter.num_layers
    if in_place and isinstance(norm, nn.Module):
        return layers[source], norm
    try:
        return adapter.copy_layer(source, 0), adapter.copy_norm()
    except NotImplementedError as exc:
        raise HeadError(f"Exit head {str(path)!r} cannot run on this target: {exc}.") from None


def shown(text: str | None) -> str:
    """A field's value for a message, cut short: a hostile file may hold anything there."""
    if text is None:
        return "missing"
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "..."
