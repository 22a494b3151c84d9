"""Damaged and forged head files: each is refused with a HeadError naming the file and the field,
before anything is built for it.

The forged files keep a valid checksum (recomputed after each change), so what is exercised is the
check of their content, not the checksum.
"""

from __future__ import annotations

import re
import resource
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from eesd_early_exit import headfile
from eesd_early_exit.drafter import EarlyExitDrafter
from eesd_early_exit.head import ExitHead
from eesd_early_exit.headfile import load_head, read_metadata, save_head
from eesd_early_exit.options import EarlyExitOptions
from hypothesis import event, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.errors import EESDError, HeadError
from eesd_core.models import find_adapter

VOCAB = 61
DROP = object()  # a field value meaning: remove the field


@pytest.fixture(scope="module")
def model():
    return make_tiny("llama", 0, vocab=VOCAB, layers=4, dtype=torch.float32)


@pytest.fixture(scope="module")
def adapter(model):
    return find_adapter(model)


@pytest.fixture(scope="module")
def heads(adapter, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Valid head files of the tiny model: a float one with a vocabulary subset, an int8 one with
    every option (two narrow layers, a top input), and a plain one on the full vocabulary."""
    folder = tmp_path_factory.mktemp("heads")
    torch.manual_seed(0)
    subset = ExitHead(adapter, 2, vocab_ids=torch.tensor([0, 3, 5, 7, 11, 13]))
    every = ExitHead(
        adapter, 2, 2, init_layer=1, vocab_ids=torch.arange(0, VOCAB, 2), top_input=True, mlp_width=16
    )
    every.init_layer = 1  # recorded in the file, as `eesd distill` records it
    plain = ExitHead(adapter, 1)
    return {
        "subset": save_head(subset, adapter, folder / "subset.safetensors"),
        "every": save_head(every, adapter, folder / "every.safetensors", storage="int8"),
        "plain": save_head(plain, adapter, folder / "plain.safetensors", dtype=torch.float32),
    }


def contents(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata()), {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118


def forge(
    source: Path,
    out: Path,
    fields: dict[str, object] | None = None,
    tensors: Callable[[dict[str, torch.Tensor]], None] | None = None,
) -> Path:
    """``source`` with ``fields`` set (``DROP``: removed) and ``tensors`` changed in place, its
    checksum recomputed unless ``fields`` sets one: a file that looks intact."""
    metadata, stored = contents(source)
    if tensors is not None:
        tensors(stored)
    metadata["tensors_sha256"] = headfile.tensors_digest(stored)
    for name, value in (fields or {}).items():
        if value is DROP:
            metadata.pop(name, None)
        else:
            metadata[name] = str(value)
    save_file(stored, str(out), metadata=metadata)
    return out


@contextmanager
def counting_copies(adapter) -> Iterator[list[int]]:
    """Count the target layers and norms copied for a head; past the target's own depth, refuse,
    so that a loader which trusts a forged layer count fails here instead of exhausting memory."""
    copied = [0]
    copy_layer, copy_norm = adapter.copy_layer, adapter.copy_norm

    def counted(copy):  # noqa: ANN001, ANN202
        def wrapper(*args):  # noqa: ANN002, ANN202
            copied[0] += 1
            if copied[0] > 2 * adapter.num_layers:
                raise MemoryError("the loader copies more layers than the target has")
            return copy(*args)

        return wrapper

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(adapter, "copy_layer", counted(copy_layer))
        patch.setattr(adapter, "copy_norm", counted(copy_norm))
        yield copied


def refused(path: Path, adapter, *fields: str) -> HeadError:
    """The HeadError of loading ``path``, which names the file and each of ``fields``, nothing
    having been copied from the target for it."""
    with counting_copies(adapter) as copied, pytest.raises(HeadError) as error:
        load_head(path, adapter)
    message = str(error.value)
    assert str(path) in message, message
    for field in fields:
        assert re.search(rf"\b{re.escape(field)}\b", message), (field, message)
    assert copied == [0], f"{copied[0]} modules were built for a refused file"
    return error.value


# -- the cases found ---------------------------------------------------------------------------


def test_a_forged_layer_count_builds_nothing(adapter, heads, tmp_path: Path) -> None:
    forged = forge(heads["subset"], tmp_path / "deep.safetensors", {"num_exit_layers": 1000000})
    error = refused(forged, adapter, "num_exit_layers")
    assert "1000000" in str(error) and "4 layers" in str(error)
    # within the target's depth, the count must still match the layers the file holds
    forged = forge(heads["subset"], tmp_path / "three.safetensors", {"num_exit_layers": 3})
    refused(forged, adapter, "tensors", "num_exit_layers")


@pytest.mark.parametrize("value", ["six", "", "6.0", " 2", "0x2", "\u0662", DROP])
def test_a_malformed_exit_layer_is_a_head_error_not_a_plugin_fault(
    model, heads, tmp_path: Path, value
) -> None:
    forged = forge(heads["subset"], tmp_path / "bad.safetensors", {"exit_layer": value})
    with pytest.raises(HeadError) as error:
        SpeculativeDecoder(model, drafter="early_exit", drafter_options={"head": str(forged)})
    assert str(forged) in str(error.value) and "exit_layer" in str(error.value)
    assert ("missing" if value is DROP else "not a whole number") in str(error.value)


def test_a_head_for_a_deeper_model_says_so(model, heads, tmp_path: Path) -> None:
    deeper = find_adapter(make_tiny("llama", 0, vocab=VOCAB, layers=8, dtype=torch.float32))
    path = save_head(ExitHead(deeper, 6), deeper, tmp_path / "deeper.safetensors")
    with pytest.raises(HeadError) as error:
        SpeculativeDecoder(model, drafter="early_exit", drafter_options={"head": str(path)})
    message = str(error.value)
    assert str(path) in message and "another model" in message and "num_target_layers" in message
    assert "'8'" in message and "'4'" in message
    # the same with its identity forged to this model's: its exit layer gives it away
    forged = forge(heads["subset"], tmp_path / "forged.safetensors", {"exit_layer": 6})
    with pytest.raises(HeadError) as error:
        SpeculativeDecoder(model, drafter="early_exit", drafter_options={"head": str(forged)})
    message = str(error.value)
    assert str(forged) in message and "deeper model" in message and "exit_layer is 6" in message
    assert "choose" not in message  # the user set no exit_layer: nothing for them to choose


def test_a_directory_is_not_reported_missing(adapter, tmp_path: Path) -> None:
    with pytest.raises(HeadError, match=r"is a directory; expected a \.safetensors") as error:
        load_head(tmp_path, adapter)
    assert str(tmp_path) in str(error.value) and "does not exist" not in str(error.value)


def test_an_empty_vocabulary_is_refused_at_load(adapter, heads, tmp_path: Path) -> None:
    def empty(tensors):  # noqa: ANN001, ANN202
        tensors["vocab_ids"] = torch.zeros(0, dtype=torch.int64)

    # as a head with an empty subset would have been written: its vocab_subset 0
    forged = forge(heads["subset"], tmp_path / "empty.safetensors", {"vocab_subset": 0}, empty)
    assert "empty" in str(refused(forged, adapter, "vocab_ids"))
    forged = forge(heads["subset"], tmp_path / "empty6.safetensors", tensors=empty)
    assert "empty" in str(refused(forged, adapter, "vocab_ids"))
    head = ExitHead(adapter, 2, vocab_ids=torch.tensor([3, 5]))
    head.vocab_ids = torch.zeros(0, dtype=torch.int64)
    with pytest.raises(HeadError, match="empty vocabulary subset"):
        save_head(head, adapter, tmp_path / "never.safetensors")


# -- every other field --------------------------------------------------------------------------


def _set(name: str, value: torch.Tensor) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(tensors):  # noqa: ANN001, ANN202
        tensors[name] = value

    return change


def _drop(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda tensors: tensors.pop(name)


FORGERIES = {
    "vocab id past the vocabulary": (
        "subset",
        {},
        _set("vocab_ids", torch.tensor([0, 3, 5, 7, 11, 61])),
        "vocab_ids",
    ),
    "negative vocab id": ("subset", {}, _set("vocab_ids", torch.tensor([-1, 3, 5, 7, 11, 13])), "vocab_ids"),
    "repeated vocab id": ("subset", {}, _set("vocab_ids", torch.tensor([0, 3, 3, 7, 11, 13])), "vocab_ids"),
    "vocab ids of int32": ("subset", {}, _set("vocab_ids", torch.arange(6, dtype=torch.int32)), "vocab_ids"),
    "more vocab ids than tokens": ("subset", {}, _set("vocab_ids", torch.arange(62)), "vocab_ids"),
    "vocab_subset against its ids": ("subset", {"vocab_subset": 5}, None, "vocab_subset"),
    "vocab_subset past the vocabulary": ("subset", {"vocab_subset": 10**9}, None, "vocab_subset"),
    "vocab ids gone": ("subset", {}, _drop("vocab_ids"), "vocab_ids"),
    "mlp_width too wide": ("subset", {"mlp_width": 65}, None, "mlp_width"),
    "mlp_width against the tensors": ("subset", {"mlp_width": 16}, None, "mlp_width"),
    "negative mlp_width": ("subset", {"mlp_width": -4}, None, "mlp_width"),
    "init_layer past the target": ("subset", {"init_layer": 4}, None, "init_layer"),
    "init_layer below -1": ("subset", {"init_layer": -2}, None, "init_layer"),
    "exit_layer 0": ("subset", {"exit_layer": 0}, None, "exit_layer"),
    "num_exit_layers missing": ("subset", {"num_exit_layers": DROP}, None, "num_exit_layers"),
    "num_exit_layers negative": ("subset", {"num_exit_layers": -1}, None, "num_exit_layers"),
    "a huge number": ("subset", {"num_exit_layers": "9" * 40}, None, "num_exit_layers"),
    "top input without its tensor": ("subset", {"exit_input": "hidden+top"}, None, "exit_input"),
    "int8 storage of float tensors": ("subset", {"storage": "int8"}, None, "storage"),
    "float storage of int8 tensors": ("every", {"storage": "float"}, None, "storage"),
    "a tensor of another shape": ("plain", {}, _set("norm.weight", torch.ones(33)), "norm.weight"),
    "a tensor of another dtype": (
        "plain",
        {},
        _set("norm.weight", torch.ones(32, dtype=torch.int32)),
        "norm.weight",
    ),
    "a tensor gone": ("plain", {}, _drop("layers.0.mlp.up_proj.weight"), "layers.0.mlp.up_proj.weight"),
    "a tensor too many": ("plain", {}, _set("layers.1.input_layernorm.weight", torch.ones(32)), "layers.1"),
    "a scale gone": ("every", {}, _drop("fuse.weight.scale"), "fuse.weight.scale"),
    "training not JSON": ("plain", {"training": "{epochs: 1"}, None, "training"),
    "training not an object": ("plain", {"training": "[1, 2]"}, None, "training"),
    "checksum not a digest": ("plain", {"tensors_sha256": "abc"}, None, "tensors_sha256"),
    "checksum missing": ("plain", {"tensors_sha256": DROP}, None, "tensors_sha256"),
    "checksum of other tensors": ("plain", {"tensors_sha256": "0" * 64}, None, "tensors_sha256"),
    "fingerprint missing": ("plain", {"fingerprint": DROP}, None, "fingerprint"),
    "hidden_size forged": ("plain", {"hidden_size": 64}, None, "hidden_size"),
    "format_version missing": ("plain", {"format_version": DROP}, None, "format_version"),
    "exit_input unknown": ("plain", {"exit_input": "tree"}, None, "exit_input"),
}


@pytest.mark.parametrize("case", list(FORGERIES))
def test_each_forgery_is_refused_naming_its_field(adapter, heads, tmp_path: Path, case: str) -> None:
    base, fields, tensors, named = FORGERIES[case]
    refused(forge(heads[base], tmp_path / "forged.safetensors", fields, tensors), adapter, named)


def test_valid_files_still_load_older_ones_too(adapter, heads, tmp_path: Path) -> None:
    for path in heads.values():
        assert load_head(path, adapter) is not None
    # files from before mlp_width, storage and exit_input were recorded
    older = forge(
        heads["plain"],
        tmp_path / "older.safetensors",
        dict.fromkeys(["mlp_width", "storage", "exit_input"], DROP),
    )
    assert load_head(older, adapter).mlp_width == 64
    # a float file may hold any float dtype, not only bfloat16; vocab_subset may be left to vocab_ids
    wider = forge(
        heads["subset"],
        tmp_path / "wider.safetensors",
        {"vocab_subset": DROP},
        tensors=lambda t: t.update({k: v.double() for k, v in t.items() if v.is_floating_point()}),
    )
    assert load_head(wider, adapter).vocab_ids.tolist() == [0, 3, 5, 7, 11, 13]
    # a head of no layers of its own (a trained norm on h_N) is one the design allows
    bare = save_head(ExitHead(adapter, 2, 0), adapter, tmp_path / "bare.safetensors")
    assert load_head(bare, adapter).num_layers == 0
    for shipped in sorted(headfile.SHIPPED_HEADS.glob("*.safetensors")):
        read_metadata(shipped)  # every field in the form the loader reads


# -- fuzzing -------------------------------------------------------------------------------------

FIELDS = [
    "format",
    "format_version",
    "architecture",
    "hidden_size",
    "vocab_size",
    "num_target_layers",
    "fingerprint",
    "exit_layer",
    "num_exit_layers",
    "mlp_width",
    "init_layer",
    "vocab_subset",
    "exit_input",
    "storage",
    "training",
    "tensors_sha256",
    "unknown",
]
ITS = re.compile(r"\bits (\w+)")
NAMED = re.compile(r"\b(" + "|".join(FIELDS[:-1]) + r"|vocab_ids|tensors?)\b")
VALUES = st.one_of(
    st.just(DROP),
    st.integers(-3, 70).map(str),
    st.sampled_from(["1000000", "9" * 30, "-1", "1e9", "2.0", " 2", "+2", "\u0663", "", "[]", "{}", "null"]),
    st.sampled_from(["hidden", "hidden+top", "float", "int8", "llama", "32", "61", "4", '{"a": 1}']),
    st.integers(-(2**70), 2**70).map(str),
    st.text(max_size=16),
)


def _tensor_change(kind: str, pick: int) -> Callable[[dict[str, torch.Tensor]], None] | None:
    def change(tensors):  # noqa: ANN001, ANN202
        names = sorted(tensors)
        name = names[pick % len(names)]
        if kind == "drop":
            tensors.pop(name)
        elif kind == "grow":
            tensors[name] = torch.cat([tensors[name], tensors[name][:1]])
        elif kind == "flatten":
            tensors[name] = tensors[name].reshape(-1)
        elif kind == "int32":
            tensors[name] = tensors[name].to(torch.int32)
        elif kind == "extra":
            tensors[f"layers.{pick}.extra"] = torch.zeros(pick % 5)
        elif kind == "vocab" and "vocab_ids" in tensors:
            ids = tensors["vocab_ids"].clone()
            ids[pick % len(ids)] = [-1, VOCAB, 2**40, int(ids[0])][pick % 4]
            tensors["vocab_ids"] = ids
        elif kind == "empty vocab":
            tensors["vocab_ids"] = torch.zeros(0, dtype=torch.int64)

    return None if kind == "none" else change


@settings(max_examples=120, deadline=None)
@given(
    base=st.sampled_from(["subset", "every", "plain"]),
    fields=st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=3),
    kind=st.sampled_from(
        ["none", "none", "drop", "grow", "flatten", "int32", "extra", "vocab", "empty vocab"]
    ),
    pick=st.integers(0, 1000),
)
def test_fuzzed_head_files_load_or_raise_a_head_error_and_stay_small(
    adapter, heads, base, fields, kind, pick
) -> None:
    """Whatever the metadata or tensors say, loading either gives a working head or raises a
    HeadError naming the file and a field, having built nothing and grown the process by little."""
    path = forge(heads[base], heads[base].parent / "fuzzed.safetensors", fields, _tensor_change(kind, pick))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    drafter = EarlyExitDrafter(EarlyExitOptions(head=str(path)))
    with counting_copies(adapter) as copied:
        try:
            drafter.attach(adapter)
        except EESDError as error:
            message = str(error)
            assert isinstance(error, HeadError), message
            assert str(path) in message and NAMED.search(message), message
            assert "does not match its metadata" not in message, "a mismatch the checks let through"
            assert copied == [0], message
            event(f"refused: {(ITS.search(message) or NAMED.search(message)).group(1)}")
        else:
            event("loaded")
            head = drafter.head
            h = torch.randn(1, 2, adapter.hidden_size)
            top = torch.randn(1, 2, adapter.hidden_size) if head.top_input else None
            with torch.no_grad():
                logits = head.logits(head.hidden(h, 0, head.new_cache(), None, top))
            assert not logits.isnan().any() and logits.isfinite().any()
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    assert grown_kib < 64 * 1024, f"the process's peak memory grew by {grown_kib} KiB"
