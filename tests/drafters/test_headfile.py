"""Exit-head files: what is written is what loads, and nothing else loads."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import torch
from eesd_early_exit import headfile
from eesd_early_exit.head import ExitHead
from eesd_early_exit.headfile import load_head, read_metadata, save_head
from safetensors.torch import save_file
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.errors import EESDError, HeadError
from eesd_core.models import find_adapter


@pytest.fixture(scope="module")
def adapter():
    return find_adapter(make_tiny("llama", 0, vocab=61, layers=4, dtype=torch.float32))


@pytest.fixture
def head_file(adapter, tmp_path: Path) -> Path:
    torch.manual_seed(0)
    head = ExitHead(adapter, 2, vocab_ids=torch.tensor([0, 3, 5, 7, 11, 13]))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return save_head(head, adapter, tmp_path / "heads" / "h.safetensors", training={"epochs": 1})


def test_round_trip_keeps_the_weights_and_settings(adapter, head_file: Path) -> None:
    metadata = read_metadata(head_file)
    assert metadata["exit_layer"] == "2" and metadata["vocab_subset"] == "6"
    assert json.loads(metadata["training"]) == {"epochs": 1}
    loaded = load_head(head_file, adapter)
    assert loaded.vocab_ids.tolist() == [0, 3, 5, 7, 11, 13]
    stored = headfile.safe_open(str(head_file), framework="pt")
    for name, value in loaded.trainable_state().items():
        assert torch.equal(value.to(torch.bfloat16), stored.get_tensor(name)), name
    # a head file is meant to be shared: readable by everyone, like any file a tool writes
    assert stat.S_IMODE(head_file.stat().st_mode) == 0o644


def test_a_head_for_another_model_is_refused(head_file: Path) -> None:
    other = find_adapter(make_tiny("llama", 1, vocab=61, layers=4, dtype=torch.float32))
    with pytest.raises(HeadError, match="distilled for another model: its fingerprint"):
        load_head(head_file, other)
    with pytest.raises(EESDError, match="another model"):
        SpeculativeDecoder(other.model, drafter="early_exit", drafter_options={"head": str(head_file)})


@pytest.mark.parametrize("keep", [0.2, 0.6, 0.99])
def test_a_truncated_file_is_refused(adapter, head_file: Path, keep: float) -> None:
    data = head_file.read_bytes()
    head_file.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(HeadError, match="truncated or corrupted"):
        load_head(head_file, adapter)


@pytest.mark.parametrize("where", [-1, -200, -5000])
def test_a_flipped_byte_in_the_weights_is_refused(adapter, head_file: Path, where: int) -> None:
    data = bytearray(head_file.read_bytes())
    data[where] ^= 0x40
    head_file.write_bytes(bytes(data))
    with pytest.raises(HeadError, match="corrupted"):
        load_head(head_file, adapter)


def test_other_safetensors_files_are_not_heads(adapter, tmp_path: Path) -> None:
    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    with pytest.raises(HeadError, match="not an eesd exit-head file"):
        load_head(plain, adapter)
    future = tmp_path / "future.safetensors"
    metadata = {"format": headfile.FORMAT, "format_version": "99"}
    save_file({"x": torch.zeros(2)}, str(future), metadata=metadata)
    with pytest.raises(HeadError, match="Upgrade eesd or re-distil"):
        load_head(future, adapter)


def test_an_interrupted_write_leaves_the_old_file_and_no_debris(
    adapter, head_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = head_file.read_bytes()

    def dies(tensors, filename, metadata=None):  # noqa: ANN001, ANN202
        Path(filename).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(headfile, "save_file", dies)
    with pytest.raises(KeyboardInterrupt):
        save_head(load_head(head_file, adapter), adapter, head_file)
    assert head_file.read_bytes() == before
    assert [p.name for p in head_file.parent.iterdir()] == [head_file.name]


def test_auto_finds_the_shipped_head_of_this_model_only(
    adapter, head_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eesd_core.testing.toy import ToyAdapter, ToyModel

    monkeypatch.setattr(headfile, "SHIPPED_HEADS", head_file.parent)
    assert headfile.find_shipped_head(adapter) == head_file
    dec = SpeculativeDecoder(adapter.model, drafter="early_exit")
    assert dec.drafter.head_path == head_file and dec.drafter.shared_layers == 2
    # same shape, other weights: not this model's head, so the untrained exit
    other = make_tiny("llama", 1, vocab=61, layers=4, dtype=torch.float32)
    assert headfile.find_shipped_head(find_adapter(other)) is None
    assert SpeculativeDecoder(other, drafter="early_exit").drafter.head_path is None
    # targets that are not Hugging Face models never match a shipped head
    toy = ToyAdapter(ToyModel(torch.full((1, 3), 1 / 3), window=0))
    assert headfile.find_shipped_head(toy) is None


def test_a_narrow_head_keeps_its_strongest_units_and_loads_as_it_was_saved(adapter, tmp_path: Path) -> None:
    from eesd_early_exit.head import mlp_width_of

    full = ExitHead(adapter, 2)
    width = mlp_width_of(full.layers[0])
    narrow = ExitHead(adapter, 2, mlp_width=width // 4)
    gate, narrow_gate = full.layers[0].mlp.gate_proj.weight, narrow.layers[0].mlp.gate_proj.weight
    assert narrow.mlp_width == width // 4 and narrow_gate.shape == (width // 4, gate.shape[1])
    # every kept unit is a unit of the copied layer, whole: its gate, up and down weights together
    for row in range(width // 4):
        unit = int((gate == narrow_gate[row]).all(dim=1).nonzero()[0, 0])
        assert torch.equal(narrow.layers[0].mlp.up_proj.weight[row], full.layers[0].mlp.up_proj.weight[unit])
        down = narrow.layers[0].mlp.down_proj.weight[:, row]
        assert torch.equal(down, full.layers[0].mlp.down_proj.weight[:, unit])
    path = save_head(narrow, adapter, tmp_path / "narrow.safetensors")
    assert read_metadata(path)["mlp_width"] == str(width // 4)
    assert path.stat().st_size < save_head(full, adapter, tmp_path / "full.safetensors").stat().st_size
    loaded = load_head(path, adapter)
    assert loaded.mlp_width == width // 4
    h = torch.randn(1, 3, adapter.hidden_size)
    rounded = {k: v.to(torch.bfloat16).float() for k, v in narrow.trainable_state().items()}
    narrow.load_state_dict(rounded, strict=False)  # as stored: in bfloat16
    with torch.no_grad():
        expected = narrow.logits(narrow.hidden(h, 0, narrow.new_cache(), None))
        got = loaded.logits(loaded.hidden(h, 0, loaded.new_cache(), None))
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="MLP width must be in"):
        ExitHead(adapter, 2, mlp_width=width + 1)


def test_int8_storage_halves_the_file_and_loads_within_half_a_step(adapter, tmp_path: Path) -> None:
    """Matrices in int8 with a scale per row: every loaded weight lies within half a step of the
    trained one, the file's tensors are checked as stored, and a storage this eesd does not know
    is refused with what to do."""
    torch.manual_seed(3)
    head = ExitHead(adapter, 2, 2, vocab_ids=torch.arange(0, 61, 2), top_input=True)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    as_float = save_head(head, adapter, tmp_path / "f.safetensors")
    as_int8 = save_head(head, adapter, tmp_path / "q.safetensors", storage="int8")
    assert read_metadata(as_int8)["storage"] == "int8" and read_metadata(as_float)["storage"] == "float"
    assert as_int8.stat().st_size < 0.65 * as_float.stat().st_size
    loaded = load_head(as_int8, adapter)
    stored = headfile.safe_open(str(as_int8), framework="pt")
    matrices = 0
    for name, value in head.trainable_state().items():
        got = loaded.trainable_state()[name]
        if value.dim() == 2:
            matrices += 1
            assert stored.get_tensor(name).dtype == torch.int8, name
            step = value.abs().amax(dim=1, keepdim=True) / 127
            assert bool(((got - value).abs() <= step / 2 * (1 + 1e-6) + 1e-12).all()), name
            assert not torch.equal(got, value)  # it really was rounded
        else:
            assert torch.equal(got, value.to(torch.bfloat16).float()), name
    assert matrices >= 8
    hidden = torch.randn(1, 3, adapter.hidden_size)
    top = torch.randn(1, 3, adapter.hidden_size)
    out = [h.hidden(hidden, 0, h.new_cache(), None, top) for h in (head, loaded)]
    assert torch.allclose(out[0], out[1], atol=0.05, rtol=0.05)

    data = bytearray(as_int8.read_bytes())
    data[-5] ^= 0x40  # a byte of the last tensor
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(bytes(data))
    with pytest.raises(HeadError, match="corrupted"):
        load_head(broken, adapter)
    with pytest.raises(HeadError, match="Unknown head storage 'int4'"):
        save_head(head, adapter, tmp_path / "x.safetensors", storage="int4")
    tensors = {name: stored.get_tensor(name) for name in stored.keys()}  # noqa: SIM118
    metadata = dict(read_metadata(as_int8), storage="int4")
    save_file(tensors, tmp_path / "future.safetensors", metadata=metadata)
    with pytest.raises(HeadError, match="stores its weights as 'int4'.*Upgrade eesd"):
        load_head(tmp_path / "future.safetensors", adapter)
