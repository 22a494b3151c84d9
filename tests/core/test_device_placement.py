"""Every tensor eesd makes says where it lives, so nothing lands on the CPU when the model is on a GPU.

This machine may have no GPU, so the check is made where the mistake starts: a tensor factory
(``torch.zeros``, ``torch.tensor``, ``nn.Linear`` ...) called from eesd's own code without a device
falls back to the default device, the CPU, and on a GPU that tensor then meets the model's on
another device. A function mode records every such call made while decoding and while building an
exit head; the tests require none. Host bookkeeping (token ids) says ``device=HOST`` on purpose.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from tinymodels import make_tiny
from torch.overrides import TorchFunctionMode

from eesd_core import SpeculativeDecoder
from eesd_core.devices import resolve_device, resolve_dtype
from eesd_core.errors import ConfigError
from eesd_core.models import find_adapter

ROOT = Path(__file__).resolve().parents[2]
OWN = [ROOT / part for part in ("eesd_core", "drafters", "controllers", "verifiers")]
FACTORIES = {
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.arange,
    torch.tensor,
    torch.as_tensor,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.eye,
    torch.linspace,
}


class Unplaced(TorchFunctionMode):
    """Records the eesd source lines that create a tensor without saying its device."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            for frame in reversed(traceback.extract_stack()[:-1]):
                path = Path(frame.filename)
                if any(path.is_relative_to(own) for own in OWN) and "testing" not in path.parts:
                    self.sites.add(f"{path.relative_to(ROOT)}:{frame.lineno}: {frame.line}")
                    break
        return func(*args, **kwargs)


SETUPS = {
    "plain": dict(drafter=None, controller="fixed"),
    "early-exit": dict(drafter="early_exit", drafter_options={"exit_layer": 2}),
    "early-exit-k4": dict(
        drafter="early_exit",
        drafter_options={"exit_layer": 2},
        controller="fixed",
        controller_options={"k": 4},
    ),
    "prompt-lookup": dict(drafter="prompt_lookup", controller="fixed", controller_options={"k": 3}),
}


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", list(SETUPS))
def test_decoding_creates_no_unplaced_tensor(name: str, temperature: float) -> None:
    model = make_tiny("llama", 3, dtype=torch.float32)
    dec = SpeculativeDecoder(model, **SETUPS[name])
    one = torch.randint(3, 97, (1, 7), generator=torch.Generator().manual_seed(1))
    batch = [[5, 6, 7, 8, 9, 5, 6], [11, 12], [20, 21, 22, 20, 21]]
    dec.generate(one, max_new_tokens=4)  # one-time setup (cost calibration) is not under test
    with Unplaced() as mode:
        dec.generate(one, max_new_tokens=24, temperature=temperature, seed=3)
        dec.generate(batch, max_new_tokens=24, temperature=temperature, seed=3)
    assert not mode.sites, "\n".join(sorted(mode.sites))


def test_building_an_exit_head_creates_no_unplaced_tensor() -> None:
    from eesd_early_exit.head import ExitHead

    adapter = find_adapter(make_tiny("qwen2", 1, dtype=torch.float32))
    with Unplaced() as mode:
        head = ExitHead(
            adapter, exit_layer=2, top_input=True, vocab_ids=torch.arange(40, device="cpu"), mlp_width=32
        )
    assert not mode.sites, "\n".join(sorted(mode.sites))
    assert {p.device for p in head.parameters()} == {adapter.device}


def test_the_guard_sees_an_unplaced_tensor() -> None:
    """The check itself: a factory call without a device from eesd's code is recorded."""
    from eesd_core import devices

    source = compile("import torch\nmade = torch.zeros(3)\n", str(Path(devices.__file__)), "exec")
    with Unplaced() as mode:
        exec(source, {})  # noqa: S102 - runs as if from eesd_core/devices.py
    assert len(mode.sites) == 1 and "eesd_core/devices.py:2" in next(iter(mode.sites))


def test_names_resolve_and_bad_ones_say_what_to_use() -> None:
    assert resolve_dtype("bfloat16") is torch.bfloat16 and resolve_dtype("torch.float16") is torch.float16
    assert resolve_dtype(torch.float64) is torch.float64
    assert resolve_device(None) == torch.device("cpu") == resolve_device("cpu")
    with pytest.raises(ConfigError, match="use one of float32, bfloat16"):
        resolve_dtype("int8")
    with pytest.raises(ConfigError, match="not one eesd decodes in"):
        resolve_dtype(torch.int32)
    with pytest.raises(ConfigError, match="Unknown device"):
        resolve_device("tpu!")
