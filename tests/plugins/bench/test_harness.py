"""End to end on a tiny random model: the CLI, its files, and the memory probe."""

from __future__ import annotations

import json
import mmap

import pytest
import torch
from bytetok import byte_tokenizer
from eesd_bench.memory import peak_during
from eesd_bench.methods import parse_method
from eesd_bench.prompts import Question
from eesd_bench.runners import BenchSettings, find_head
from eesd_bench.session import Session

from eesd_core.cli import main

VOCAB = 259
REPEATED = "the cat sat on the mat, the cat sat on the mat, the cat"


def _tokenizer():
    return byte_tokenizer()


@pytest.fixture
def checkpoint(tmp_path, tiny):
    path = tmp_path / "tiny"
    tiny("llama", seed=2, vocab=VOCAB, dtype=torch.float32).save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [
        {"question_id": 1, "category": "writing", "turns": [REPEATED, "again"]},
        {"question_id": 2, "category": "summarization", "turns": ["Summarise: " + REPEATED]},
        {"question_id": 3, "category": "summarization", "turns": ["not chosen"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_cli_writes_json_markdown_and_plot(checkpoint, questions, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "--model",
            str(checkpoint),
            "--questions",
            str(questions),
            "--per-category",
            "1",
            "--max-new-tokens",
            "12",
            "--methods",
            "hf",
            "eesd_plain",
            "eesd:controller=fixed,k=2",
            "eesd_prompt_lookup",
            "hf_early_exit",
            "oracle",
            "--exit-layer",
            "2",
            "--max-draft-tokens",
            "3",
            "--no-memory",
            "--modelled",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    assert result["schema"] == "eesd-bench/2"
    assert {"torch", "transformers", "cpu", "threads", "date"} <= set(result["environment"])
    assert result["settings"]["exit_layer_used"] == 2 and result["settings"]["head"] == "auto"
    assert result["settings"]["early_exit_drafter"].startswith("target layers [0, 2)")
    names = ["hf", "eesd_plain", "eesd:controller=fixed,k=2", "eesd_prompt_lookup", "hf_early_exit"]
    assert [m["name"] for m in result["methods"]] == [*names, "oracle"]
    assert len(result["samples"]) == 2 * len(names)
    assert {s["question_id"] for s in result["samples"]} == {1, 2}
    assert all(s["equal"] for s in result["samples"]), result["mismatches"]
    overall = result["summary"]["overall"]
    assert overall["hf"]["speedup"] == pytest.approx(1.0)
    assert overall["eesd_plain"]["mean_accepted_tokens"] == pytest.approx(1.0)
    assert overall["hf"]["mean_accepted_tokens"] == pytest.approx(1.0)
    assert overall["eesd:controller=fixed,k=2"]["acceptance_by_position"]
    assert set(result["summary"]["groups"]) == {"mt_bench", "summarization"}
    page = (out / "results.md").read_text()
    assert "## Speedup by task" in page and "| eesd_prompt_lookup |" in page
    assert "Every output equals the baseline's token for token." in page
    if result["modelled"] is not None:
        assert "## Modelled speedup" in page
    if result["oracle"] is not None:
        controllers = [row["controller"] for row in result["oracle"]["overall"]]
        assert controllers[2] == "oracle per round" and controllers[3] == "eesd:controller=fixed,k=2"
        assert set(result["oracle"]["groups"]) == {"mt_bench", "summarization"}
        assert "## Replayed bound" in page
    pytest.importorskip("matplotlib")
    assert (out / "speedup.png").stat().st_size > 0
    assert "speedup" in capsys.readouterr().out


def test_session_sampled_with_record(checkpoint, tmp_path, monkeypatch) -> None:
    from eesd_bench import cli
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    prompts = [(Question(1, "qa", "x"), [1, 5, 6, 7, 5, 6])]
    settings = BenchSettings(max_new_tokens=6, temperature=0.7, seed=1, exit_layer=1)
    session = Session(model, prompts, [parse_method("hf"), parse_method("eesd_default")], settings)
    result = session.run(progress=False)
    assert [s["equal"] for s in result["samples"]] == [None, None]
    files = session.write(result, tmp_path / "run")
    recorded = cli.record(files, tmp_path / "results", "tiny", settings)
    assert {f.name for f in recorded} >= {"tiny-t0.7.json", "tiny-t0.7.md"}


def test_peak_during_sees_an_allocation() -> None:
    # A fresh anonymous mapping, touched page by page: the allocator cannot hand back memory that is
    # already resident (after earlier tests freed large tensors, torch.ones may reuse heap pages).
    size = 16 * 2**20
    block = []

    def allocate() -> None:
        area = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            area[offset] = 1
        block.append(area)

    result = peak_during(allocate)
    if result["peak_rss_delta_bytes"] is None:
        pytest.skip("this kernel does not let a process reset its peak RSS")
    assert result["peak_rss_delta_bytes"] >= 12 * 2**20


def test_auto_head_finds_nothing_in_a_plain_checkpoint(checkpoint) -> None:
    assert find_head(checkpoint) is None


@pytest.mark.slow
def test_memory_probe_in_a_child_process(checkpoint) -> None:
    from eesd_bench.memory import measure

    probe = measure(str(checkpoint), "eesd:drafter=none", [1, 5, 6], BenchSettings(max_new_tokens=8))
    assert "error" not in probe, probe
    assert probe["model_bytes"] > 0 and probe["new_tokens"] == 8 and probe["kv_cache_bytes"] > 0
