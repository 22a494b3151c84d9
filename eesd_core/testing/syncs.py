"""Counting the times the host waits for the device, on any machine (a CPU included).

On a GPU the host waits for all the work queued before it whenever it reads a device tensor
(``item``, ``tolist``, ``bool``, a blocking copy to the CPU) and whenever it copies host data onto
the device without ``non_blocking=True`` (``torch.tensor(values, device=...)`` included). A round
that promises one wait must not make two. :class:`DeviceSyncs` tells device tensors from host ones
without a GPU: a tensor is the device's when it is a weight or buffer of the model, when a factory
made it with a ``device=`` other than :data:`~eesd_core.devices.HOST` (the very object: on a CPU
another ``torch.device("cpu")`` stands for the model's device), when it was copied to such a
device, or when any operation computed it from a device tensor. A copy to the host made with
``non_blocking=True`` is the host's and waits for nothing until the host reads something computed
after it.
"""

from __future__ import annotations

import traceback
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from eesd_core.devices import HOST

_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy"}
_FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "rand", "randn", "randint"}
_FROM_DATA = {"tensor", "as_tensor"}  # factories that copy host data
_ROOT = Path(__file__).resolve().parents[2]


class DeviceSyncs(torch.overrides.TorchFunctionMode):
    """While entered (``with DeviceSyncs(model) as syncs:``), ``syncs.sites`` lists each wait for
    the device as ``"what@file:line"`` (the innermost frame in the project or its plug-ins)."""

    def __init__(self, model: torch.nn.Module | Iterable[torch.Tensor]) -> None:
        super().__init__()
        tensors = [*model.parameters(), *model.buffers()] if isinstance(model, torch.nn.Module) else model
        self._device: dict[int, weakref.ref[torch.Tensor]] = {}
        self.sites: list[str] = []
        for tensor in tensors:
            self._mark(tensor)

    def _mark(self, tensor: torch.Tensor) -> None:
        self._device[id(tensor)] = weakref.ref(tensor)

    def on_device(self, value: Any) -> bool:
        """Whether ``value`` is a tensor this counter holds for the device's."""
        held = self._device.get(id(value)) if isinstance(value, torch.Tensor) else None
        return held is not None and held() is value

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        given = [*args, *kwargs.values()]
        given += [item for value in given if isinstance(value, (list, tuple)) for item in value]
        from_device = any(self.on_device(value) for value in given)
        targets = [*args[1:], kwargs.get("device")] if name in ("to", "cpu") else []
        to_host = name == "cpu" or any(_is_host(target) for target in targets)
        to_device = name == "to" and not to_host and any(isinstance(t, (str, torch.device)) for t in targets)
        out = func(*args, **kwargs)
        if (to_host or to_device) and out is args[0]:
            out = out.clone()  # on a CPU a copy between host and device may be the tensor itself
        waits = not (kwargs.get("non_blocking") or (name == "to" and any(a is True for a in args[2:])))
        made = name in _FACTORIES and kwargs.get("device") is not None and kwargs["device"] is not HOST
        if from_device and (name in _READS or (to_host and waits)):
            self.sites.append(f"{name}@{_site()}")
        elif (made and name in _FROM_DATA) or (to_device and waits and not from_device):
            self.sites.append(f"{name} onto the device@{_site()}")
        outputs = out if isinstance(out, (list, tuple)) else [out]
        for tensor in (o for o in outputs if isinstance(o, torch.Tensor)):
            if to_host:
                self._device.pop(id(tensor), None)
            elif from_device or made or to_device:
                self._mark(tensor)
        return out


def _is_host(device: Any) -> bool:
    """``HOST`` itself or a name of the CPU."""
    return device is HOST or (isinstance(device, str) and torch.device(device).type == "cpu")


def _site() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = Path(frame.filename)
        if path.is_relative_to(_ROOT) and "testing" not in path.parts:
            return f"{path.relative_to(_ROOT)}:{frame.lineno}"
    return "?"
