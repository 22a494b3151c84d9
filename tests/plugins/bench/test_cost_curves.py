"""``benchmarks/cost_curves.py`` on the tiny shape: every timing lands in the JSON, beside the
modelled speedups and the three checks; a device or dtype it cannot use is refused by name."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "cost_curves.py"


@pytest.fixture(scope="module")
def cost_curves() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cost_curves", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_run(cost_curves: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    out = tmp_path_factory.mktemp("costs") / "costs-tiny.json"
    argv = ["--shape", "tiny", "--repeats", "3", "--context", "16", "--tokens", "24", "--threads", "1"]
    threads = torch.get_num_threads()
    try:
        cost_curves.main([*argv, "--alpha", "0.55", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    return json.loads(out.read_text()), out.read_text(), out


def positive(entry: dict, repeats: int = 3) -> None:
    assert len(entry["times"]) == repeats
    assert entry["median"] > 0


def test_every_pass_is_timed(tiny_run: tuple[dict, str, Path]) -> None:
    data, _, _ = tiny_run
    assert (data["shape"], data["layers"], data["device"], data["dtype"]) == ("tiny", 4, "cpu", "float32")
    assert data["torch"] and data["transformers"] and data["context"] == 16 and data["repeats"] == 3
    timings = data["timings"]
    positive(timings["plain_step"])
    positive(timings["hf_forward"])
    assert [v["m"] for v in timings["verify"]] == list(range(1, 17))
    for entry in timings["verify"]:
        positive(entry)
    assert list(timings["draft"]) == ["2"]  # 4, 6, 8 are not below 4 layers
    draft = timings["draft"]["2"]
    for name in ("exit_head", "untrained", "lower"):
        positive(draft[name])
    assert [t["m"] for t in draft["tail"]] == list(range(1, 10))


def test_rounds_give_the_overhead(tiny_run: tuple[dict, str, Path]) -> None:
    data, _, _ = tiny_run
    rounds = data["timings"]["rounds"]
    assert rounds["exit_layer"] == 2 and rounds["plain"]["median"] > 0
    assert list(rounds["by_k"]) == ["0", "1", "2", "4", "8"]
    over = data["overhead"]
    assert "overhead(k) = median time" in over["derivation"]
    for key, o in over["by_k"].items():
        assert o["round"] == rounds["by_k"][key]["median"]
        assert o["overhead"] == pytest.approx(o["round"] - o["passes"])
        assert o["of_plain"] == pytest.approx(o["overhead"] / data["timings"]["plain_step"]["median"])


def test_speedups_are_modelled_for_each_alpha(tiny_run: tuple[dict, str, Path]) -> None:
    data, _, _ = tiny_run
    model = data["modelled"]
    assert "MODELLED" in model["note"]
    assert model["alphas"] == [0.5, 0.55, 0.6, 0.7, 0.8]
    best = model["by_exit_layer"]["2"]["best"]
    assert [b["alpha"] for b in best] == model["alphas"]
    for b in best:
        assert 0 <= b["k"] <= 8 and b["speedup"] >= 1.0  # k = 0 is plain decoding, 1.00x
    assert len(model["by_exit_layer"]["2"]["costs"]["verify"]) == 9


def test_the_checks_carry_their_ratio(cost_curves: ModuleType, tiny_run: tuple[dict, str, Path]) -> None:
    data, _, _ = tiny_run
    rows, over, bound = data["checks"]
    verify, floor = data["timings"]["verify"], data["memory"]
    assert "verification" in rows["name"] and "overhead" in over["name"] and "weights" in bound["name"]
    assert rows["ratio"] == pytest.approx(verify[8]["median"] / verify[0]["median"])
    assert over["ratio"] == max(o["of_plain"] for o in data["overhead"]["by_k"].values())
    model = cost_curves.build_model("tiny", 4, torch.device("cpu"), torch.float32)
    embed = model.get_input_embeddings().weight.numel()  # untied: a step reads one row of it
    tiny = (sum(p.numel() for p in model.parameters()) - embed) * 4
    assert floor["weight_bytes"] == tiny and floor["copy_bandwidth"] > 0
    assert bound["ratio"] == pytest.approx(verify[0]["median"] * floor["copy_bandwidth"] / tiny)
    for check in (rows, over, bound):
        assert check["pass"] == (check["ratio"] <= check["limit"])


def test_json_is_written_whole(tiny_run: tuple[dict, str, Path]) -> None:
    _, text, out = tiny_run
    assert list(out.parent.iterdir()) == [out]  # no temporary file left beside it
    assert text.rstrip().endswith("}")


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [("--dtype", "int8", "dtype 'int8' is not one eesd decodes in"), ("--device", "tpu9", "Unknown device")],
)
def test_an_unusable_device_or_dtype_is_refused(
    cost_curves: ModuleType, capsys: pytest.CaptureFixture[str], flag: str, value: str, says: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        cost_curves.main(["--shape", "tiny", flag, value])
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_the_attention_kernels_can_be_chosen(
    cost_curves: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--sdpa`` runs every pass under ``torch.nn.attention.sdpa_kernel`` with those kernels (on a
    GPU, to see what cuDNN attention's per-shape plans cost) and records them."""
    from torch.nn.attention import SDPBackend

    entered = []
    real = torch.nn.attention.sdpa_kernel

    def recording(backends):  # noqa: ANN001, ANN202
        entered.append(list(backends))
        return real(backends)

    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel", recording)
    argv = ["--shape", "tiny", "--repeats", "1", "--context", "8", "--tokens", "18", "--threads", "1"]
    threads = torch.get_num_threads()
    try:
        data = cost_curves.main([*argv, "--sdpa", "math"])
    finally:
        torch.set_num_threads(threads)
    assert data["sdpa"] == ["math"] and entered == [[SDPBackend.MATH]]
    with pytest.raises(SystemExit):
        cost_curves.main(["--shape", "tiny", "--sdpa", "cudnn,fast"])
    assert "not ['fast']" in capsys.readouterr().err
