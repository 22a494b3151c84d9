"""Where a model runs and in what precision: names checked before anything is loaded."""

from __future__ import annotations

import torch

from eesd_core.errors import ConfigError

DTYPES = {name: getattr(torch, name) for name in ("float32", "bfloat16", "float16", "float64")}
HALF = (torch.bfloat16, torch.float16)
HOST = torch.device("cpu")  # where the engine keeps token ids and other bookkeeping it reads each round
# Rows x slots; larger passes' activations outgrow what the C allocator recycles: faulted in per layer.
CPU_PASS_TOKENS = 512


def later(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` copied to the host without the host waiting: read it once the host has read a
    tensor computed after it (a read waits for everything queued before it)."""
    return tensor.to(HOST, non_blocking=not tensor.is_mps)


def pass_tokens(device: torch.device) -> int | None:
    """The most tokens one pass of a batch prefill covers on ``device`` (None: no limit)."""
    return CPU_PASS_TOKENS if device.type == "cpu" else None


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from its name (``"bfloat16"``) or itself; only the four eesd decodes in."""
    found = dtype if dtype in DTYPES.values() else DTYPES.get(str(dtype).removeprefix("torch."))
    if found is None:
        raise ConfigError(f"dtype {dtype!r} is not one eesd decodes in: use one of {', '.join(DTYPES)}.")
    return found  # type: ignore[return-value]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """A device torch can run on here (``"cpu"`` when None, ``"cuda"``, ``"cuda:1"``, ``"mps"``)."""
    try:
        found = torch.device(device if device is not None else "cpu")
    except (RuntimeError, TypeError):
        raise ConfigError(f"Unknown device {device!r}: use 'cpu', 'cuda', 'cuda:N' or 'mps'.") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"Device {device!r} asked for, but this torch ({torch.__version__}) sees no CUDA "
            "GPU: run on --device cpu, or install a CUDA build of torch on a machine with a GPU."
        )
    if found.type == "cuda" and (found.index or 0) >= torch.cuda.device_count():
        raise ConfigError(
            f"Device {device!r} asked for, but only {torch.cuda.device_count()} GPU(s) are visible."
        )
    if found.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"Device {device!r} asked for, but torch reports no MPS backend here.")
    if found.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"eesd cannot decode on device {device!r}: use 'cpu', 'cuda' or 'mps'.")
    return found
