"""``eesd bench-batch`` on a tiny random model: the command end to end, its equality check, its counting."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
import torch
from bytetok import byte_tokenizer
from eesd_bench.batch import batched_methods, interleave, left_pad, make_batch, summarize, until_eos
from eesd_bench.prompts import Question
from tinymodels import make_tiny

from eesd_core.cli import main
from eesd_core.tools import encode_prompt

VOCAB = 259
MAX_NEW = 12
TEXTS = {
    1: ("writing", "the cat sat on the mat, the cat sat on the mat"),
    2: ("summarization", "Summarise: a dog ran in the park"),
    3: ("summarization", "Summarise: rain fell all day"),
}


def _tokenizer():
    return byte_tokenizer()


def _greedy(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW)
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny checkpoint whose EOS ends question 1's greedy reply early and no other reply.

    Returns the path and each question's solo reply (up to its EOS). The tokenizer has no pad token,
    so batches are padded with its EOS "</s>" (id 2), which is not the model's EOS.
    """
    model = make_tiny("llama", seed=4, vocab=VOCAB, dtype=torch.float32)
    tokenizer = _tokenizer()
    replies = {qid: _greedy(model, encode_prompt(tokenizer, text)) for qid, (_, text) in TEXTS.items()}
    first = replies[1]
    others = {t for qid, reply in replies.items() if qid != 1 for t in reply}
    eos = next(t for i, t in enumerate(first) if i >= 3 and t not in first[:i] and t not in others and t != 2)
    model.generation_config.eos_token_id = model.config.eos_token_id = eos
    model.generation_config.pad_token_id = model.config.pad_token_id = None
    path = tmp_path_factory.mktemp("batch") / "tiny"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, {qid: until_eos(reply, {eos}) for qid, reply in replies.items()}


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [{"question_id": q, "category": c, "turns": [t]} for q, (c, t) in TEXTS.items()]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _run(checkpoint, questions, out, *extra: str) -> int:
    return main(
        [
            "bench-batch",
            "--model",
            str(checkpoint[0]),
            "--questions",
            str(questions),
            "--batch-sizes",
            "1",
            "2",
            "--max-new-tokens",
            str(MAX_NEW),
            "--exit-layer",
            "2",
            "--max-draft-tokens",
            "3",
            "--out",
            str(out),
            *extra,
        ]
    )


def test_the_command_times_each_method_at_each_size_and_writes_its_files(
    checkpoint, questions, tmp_path, capsys
) -> None:
    out = tmp_path / "out"
    assert _run(checkpoint, questions, out, "--repeats", "2") == 0
    result = json.loads((out / "batch.json").read_text())
    assert result["schema"] == "eesd-bench-batch/1" and result["settings"]["batch_sizes"] == [1, 2]
    assert result["settings"]["pad_token_id"] == 2 and result["settings"]["eos_token_id"] != [2]
    methods = ["hf", "eesd_plain", "eesd_default"]
    assert [(r["batch_size"], r["method"]) for r in result["summary"]] == [
        (b, m) for b in (1, 2) for m in methods
    ]
    assert len(result["samples"]) == 2 * 2 * len(methods)
    firsts = [s["method"] for s in result["samples"][:: len(methods)]]
    assert firsts[0] != firsts[1], "the order of methods rotates between repeats"
    assert result["mismatches"] == []
    replies = checkpoint[1]
    assert len(replies[1]) < MAX_NEW and len(replies[2]) == MAX_NEW
    for sample in result["samples"]:
        rows = result["batches"][str(sample["batch_size"])]
        assert sample["row_new_tokens"] == [len(replies[q]) for q in rows]
        assert sample["new_tokens"] == sum(sample["row_new_tokens"])
        if sample["method"] == "hf":
            assert sample["row_seconds"] == [sample["seconds"]] * len(rows)
        else:
            assert all(0 < t <= sample["seconds"] for t in sample["row_seconds"])
            assert sample["engine_new_tokens"] == sample["new_tokens"]
            assert sample["withdrawn"] >= 0 and (sample["method"] != "eesd_plain" or sample["withdrawn"] == 0)
    rows = {(r["batch_size"], r["method"]): r for r in result["summary"]}
    assert rows[2, "hf"]["vs_baseline"] == pytest.approx(1.0)
    assert rows[2, "eesd_plain"]["vs_plain"] == pytest.approx(1.0)
    assert rows[2, "eesd_default"]["vs_plain"] > 0 and rows[2, "eesd_plain"]["mean_accepted_tokens"] == 1.0
    page = (out / "batch.md").read_text()
    assert "| B | method | tokens/s | x hf | x eesd_plain |" in page and "| 2 | eesd_default |" in page
    assert "Every row of every eesd run equals" in page
    assert isinstance(result["environment"]["products"], str)  # the plan this process chose
    assert (
        f"Short passes (eesd's products, chosen in this process): {result['environment']['products']}."
        in page
    )
    assert "| B | method |" in capsys.readouterr().out
    assert not list(out.glob(".*.partial"))
    pytest.importorskip("matplotlib")
    assert (out / "batch.png").read_bytes()[:4] == b"\x89PNG"


def test_a_row_that_differs_from_its_solo_reply_fails_the_run(
    checkpoint, questions, tmp_path, monkeypatch, capsys
) -> None:
    from eesd_core.engine import SpeculativeDecoder

    generate = SpeculativeDecoder.generate

    def off_by_one(self, input_ids, **kwargs):
        result = generate(self, input_ids, **kwargs)
        if self.drafter is None and input_ids.shape[0] == 2:
            first = input_ids.shape[1]
            result.sequences[1, first] = (result.sequences[1, first] + 1) % VOCAB
        return result

    monkeypatch.setattr(SpeculativeDecoder, "generate", off_by_one)
    out = tmp_path / "out"
    assert _run(checkpoint, questions, out, "--repeats", "1", "--methods", "hf", "eesd_plain") == 1
    result = json.loads((out / "batch.json").read_text())
    found = [(w["method"], w["batch_size"], w["row"], w["first_diff"]) for w in result["mismatches"]]
    assert found == [("eesd_plain", 2, 1, 0)]
    assert (
        "Rows that differ from their solo greedy reply (1): eesd_plain at B=2, row 1, token 0"
        in (out / "batch.md").read_text()
    )
    assert "mismatch: eesd_plain at B=2, repeat 1, row 1" in capsys.readouterr().err


def test_a_row_counts_its_tokens_up_to_and_including_its_eos() -> None:
    assert until_eos([5, 7, 3, 0, 0], {3}) == [5, 7, 3]
    assert until_eos([5, 3, 3, 3], {3}) == [5, 3], "padding with the EOS id is not counted"
    assert until_eos([5, 7, 9], {3}) == [5, 7, 9]
    assert until_eos([5, 4, 3], {3, 4}) == [5, 4]
    assert until_eos([5, 7], set()) == [5, 7]


def test_batches_are_left_padded_and_repeat_the_pool() -> None:
    ids, mask = left_pad([[5, 6, 7], [8]], pad=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    batch = make_batch([[5, 6], [7]], 3, pad=9)
    assert batch.rows == (0, 1, 0) and batch.ids.tolist() == [[5, 6], [9, 7], [5, 6]]
    mixed = interleave([Question(i, c, "") for i, c in enumerate("aabbb")])
    assert [q.question_id for q in mixed] == [0, 2, 1, 3, 4]


def test_ratios_are_paired_within_a_repeat() -> None:
    def sample(method: str, repeat: int, tps: float) -> dict:
        return dict(method=method, batch_size=4, repeat=repeat, tokens_per_second=tps, seconds=1.0)

    hf, plain = [10.0, 20.0, 30.0], [20.0, 20.0, 60.0]
    samples = [sample("hf", r, v) for r, v in enumerate(hf)] + [
        sample("p", r, v) for r, v in enumerate(plain)
    ]
    for s in samples:
        s.update(row_latency=1.0, new_tokens=10)
    (hf_row, plain_row) = summarize(samples, ["hf", "p"], "hf", "p")
    assert plain_row["tokens_per_second"] == 20.0 and hf_row["tokens_per_second"] == 20.0
    assert plain_row["vs_baseline"] == 2.0, "the median of 2, 1 and 2, not the ratio of medians"
    assert hf_row["vs_plain"] == 0.5 and hf_row["mean_accepted_tokens"] is None


def test_methods_that_cannot_run_batched_are_left_out_with_a_note() -> None:
    registered = {"drafter": ["early_exit"], "controller": ["thompson"], "verifier": ["lossless"]}
    specs, notes = batched_methods(["hf", "hf_early_exit", "oracle", "eesd_plain"], registered)
    assert [s.name for s in specs] == ["hf", "eesd_plain"]
    assert any(n.startswith("hf_early_exit: skipped") for n in notes) and any("oracle" in n for n in notes)


@pytest.mark.slow
def test_the_memory_probe_runs_a_batch_in_a_child_process(checkpoint) -> None:
    from dataclasses import asdict

    from eesd_bench.batch import probe_in_child
    from eesd_bench.runners import BenchSettings

    request = dict(
        model=str(checkpoint[0]),
        method="eesd_plain",
        prompts=[[1, 5, 6], [1, 7]],
        pad=2,
        settings=asdict(BenchSettings(max_new_tokens=8)),
        dtype="float32",
        threads=1,
    )
    probed = probe_in_child(request, timeout=120)
    assert "error" not in probed, probed
    assert probed["model_bytes"] > 0 and probed["kv_cache_bytes"] > 0


def test_the_table_puts_each_peak_beside_transformers() -> None:
    from eesd_bench.batch import _table_rows

    row = dict(tokens_per_second=1.0, vs_baseline=None, vs_plain=None, row_latency=1.0, seconds=1.0)
    row.update(new_tokens=8, mean_accepted_tokens=None, batch_size=4)
    result = {
        "settings": {"baseline": "hf", "plain": "eesd_plain"},
        "summary": [{**row, "method": "hf"}, {**row, "method": "eesd_plain"}],
        "memory": {
            "hf": {"4": {"peak_rss_delta_bytes": 40 * 2**20}},
            "eesd_plain": {"4": {"peak_rss_delta_bytes": 30 * 2**20}},
        },
    }
    header, rows = _table_rows(result)
    assert header[-2:] == ["peak RSS delta", "RSS x hf"]
    assert [r[-2:] for r in rows] == [["40.0 MiB", "1.00"], ["30.0 MiB", "0.75"]]


def test_every_method_warms_up_at_each_batch_size_before_it_is_timed() -> None:
    from types import SimpleNamespace

    from eesd_bench.batch import WARMUP_TOKENS, measure

    calls: list[tuple[str, int, int]] = []

    class Runner:
        def __init__(self, name: str) -> None:
            self.name = name

        def run(self, ids, mask, max_new_tokens):  # noqa: ANN001, ANN202
            calls.append((self.name, ids.shape[0], max_new_tokens))
            rows = [[5] * max_new_tokens for _ in range(ids.shape[0])]
            return SimpleNamespace(rows=rows, seconds=1.0, row_seconds=[1.0] * len(rows), stats={})

    pool = [[1, 2, 3], [4, 5]]
    batches = [make_batch(pool, size, 0) for size in (1, 4)]
    measure({"a": Runner("a"), "b": Runner("b")}, batches, repeats=2, max_new_tokens=32)
    for size in (1, 4):
        at_size = [(name, n) for name, b, n in calls if b == size]
        assert at_size[:2] == [("a", WARMUP_TOKENS), ("b", WARMUP_TOKENS)]
        assert sorted(at_size[2:]) == [("a", 32), ("a", 32), ("b", 32), ("b", 32)]


def test_the_attention_kernels_can_be_chosen_for_every_method(
    checkpoint, questions, tmp_path, monkeypatch, capsys
) -> None:
    """``--sdpa math`` runs every timed call, of transformers and of eesd alike, under
    ``torch.nn.attention.sdpa_kernel`` with only that kernel, and records the choice."""
    import torch.nn.attention as attention

    active, calls = [], []
    real = attention.sdpa_kernel

    @contextmanager
    def recording(backends):  # noqa: ANN001, ANN202
        active.append(list(backends))
        with real(backends):
            yield
        active.pop()

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(list(active))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_kernel", recording)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    out = tmp_path / "out"
    assert _run(checkpoint, questions, out, "--repeats", "1", "--sdpa", "math") == 0
    assert json.loads((out / "batch.json").read_text())["settings"]["sdpa"] == ["math"]
    assert calls and all(c == [[attention.SDPBackend.MATH]] for c in calls)
    with pytest.raises(SystemExit):
        _run(checkpoint, questions, out, "--sdpa", "cudnn,fast")
    assert "not ['fast']" in capsys.readouterr().err
