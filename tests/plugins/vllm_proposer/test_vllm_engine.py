"""The eesd proposer inside a real vLLM engine (vLLM's CPU build), on a tiny Llama written to disk.

Each configuration is served in a process of its own (``python -m eesd_vllm.engine``), as two
engines in one process do not mix. Skipped, with the reason, where vLLM is not installed:
``make test-vllm`` sets up an environment with it and runs these.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tinymodels import make_tiny

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed here: `make test-vllm` runs these with vLLM's CPU build",
    ),
]

EXIT = 2
PROMPT_LENGTHS = (5, 17, 3, 30, 8, 12)
LIMITS = [40, 33, 47, 21, 60, 9]  # different lengths: requests finish mid-round, at other steps


def write_tiny(path: Path, vocab: int) -> Path:
    """A tiny Llama vLLM's CPU attention serves (head_dim 64), whose layers past the exit barely
    change the residual stream: drafts from layer 2 are mostly, not always, right."""
    model = make_tiny(
        "llama",
        7,
        vocab=vocab,
        layers=4,
        dtype=torch.float32,
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
    )
    with torch.no_grad():
        for layer in model.model.layers[EXIT:]:
            layer.self_attn.o_proj.weight.mul_(0.05)
            layer.mlp.down_proj.weight.mul_(0.05)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("vllm-tiny"), 512)


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 tokens: the 2,304 pairs of first two tokens are few enough for an exact test."""
    return write_tiny(tmp_path_factory.mktemp("vllm-tiny-48"), 48)


def prompts(vocab: int = 512) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    out = []
    for n in PROMPT_LENGTHS:
        body = torch.randint(3, vocab, (n,), generator=gen).tolist()
        out.append([1] + body * (1 + n % 3))
    return out


def serve(checkpoint: Path, tmp_path: Path, method: str, **extra: object) -> dict:
    """Run one configuration in its own process; its JSON result (tokens, seconds, statistics)."""
    question = tmp_path / f"prompts-{method}.json"
    question.write_text(json.dumps(extra.pop("prompts", prompts())))
    out = tmp_path / f"out-{method}-{len(list(tmp_path.iterdir()))}.json"
    command = [
        sys.executable,
        "-m",
        "eesd_vllm.engine",
        "--model",
        str(checkpoint),
        "--method",
        method,
        "--prompts",
        str(question),
        "--out",
        str(out),
        "--max-model-len",
        "128",
        "--memory-fraction",  # a tiny model: start beside whatever else the machine runs
        "0.3",
    ]
    for key, value in extra.items():
        command += [f"--{key.replace('_', '-')}", value if isinstance(value, str) else json.dumps(value)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode:
        return {"error": done.stdout[-4000:] + done.stderr[-4000:]}
    return json.loads(out.read_text())


def test_greedy_equals_vllm_without_speculation_under_preemption(checkpoint: Path, tmp_path: Path) -> None:
    common = dict(max_tokens=LIMITS, kv_blocks="6", k="4")  # six 32-token blocks: requests get preempted
    plain = serve(checkpoint, tmp_path, "plain", **common)
    assert "error" not in plain, plain.get("error")
    fixed = serve(
        checkpoint,
        tmp_path,
        "eesd",
        options={"exit_layer": EXIT, "head": None, "controller": "fixed", "controller_options": {"k": 4}},
        **common,
    )
    assert "error" not in fixed, fixed.get("error")
    thompson = serve(checkpoint, tmp_path, "eesd", options={"exit_layer": EXIT, "head": None}, **common)
    assert "error" not in thompson, thompson.get("error")
    assert [len(t) for t in plain["tokens"]] == LIMITS
    assert fixed["tokens"] == plain["tokens"]
    assert thompson["tokens"] == plain["tokens"]
    assert fixed["preemptions"] > 0 and thompson["preemptions"] > 0
    stats = fixed["proposer"]
    assert stats["accepted"] > 0.3 * stats["drafted"] and stats["accepted"] < stats["drafted"]
    assert thompson["proposer"]["accepted"] > 0


def test_a_top_input_head_reads_vllms_last_layer_states(checkpoint: Path, tmp_path: Path) -> None:
    """The proposer hooks vLLM's eagerly run model for the last-layer states a top-input head
    reads: every request drafts with them (none lacks a state), and greedy output is unchanged,
    with and without preemption."""
    from eesd_early_exit.head import ExitHead
    from eesd_early_exit.headfile import save_head
    from transformers import AutoModelForCausalLM

    from eesd_core.models import find_adapter

    adapter = find_adapter(AutoModelForCausalLM.from_pretrained(checkpoint).eval())
    torch.manual_seed(6)
    head = ExitHead(adapter, EXIT, top_input=True)  # a copy of the last layer, reading h_2
    with torch.no_grad():  # and, weakly, the top state
        head.fuse.weight[:, adapter.hidden_size :].normal_(0, 0.0003)
    path = save_head(head, adapter, tmp_path / "top.safetensors")
    options = {"head": str(path), "controller": "fixed", "controller_options": {"k": 3}}
    plain = serve(checkpoint, tmp_path, "plain", max_tokens=LIMITS, k="3")
    assert "error" not in plain, plain.get("error")
    free = serve(checkpoint, tmp_path, "eesd", max_tokens=LIMITS, k="3", options=options)
    assert "error" not in free, free.get("error")
    squeezed = serve(checkpoint, tmp_path, "eesd", max_tokens=LIMITS, k="3", kv_blocks="6", options=options)
    assert "error" not in squeezed, squeezed.get("error")
    assert free["tokens"] == plain["tokens"] and squeezed["tokens"] == plain["tokens"]
    stats = free["proposer"]
    assert stats["without_top_states"] == 0 and stats["joined_rounds"] > 0
    assert 0.3 * stats["drafted"] < stats["accepted"] < stats["drafted"]
    assert squeezed["preemptions"] > 0 and squeezed["proposer"]["accepted"] > 0


def test_sampled_output_follows_the_target(small_vocab: Path, tmp_path: Path) -> None:
    """At temperature 1 the first two tokens of many requests follow plain sampling's exact
    distribution (false-fail rate 1e-6): the second token always passes vLLM's rejection sampler
    over a draft, since a fixed k = 4 drafts every round."""
    from transformers import AutoModelForCausalLM

    from eesd_core.protocols import SamplingParams
    from eesd_core.testing import assert_same_distribution
    from eesd_core.testing.hf import first_tokens_distribution

    prompt = prompts(48)[0]
    runs = 1000
    result = serve(
        small_vocab,
        tmp_path,
        "eesd",
        prompts=[prompt] * runs,
        max_tokens=2,
        temperature="1.0",
        k="4",
        options={"exit_layer": EXIT, "head": None, "controller": "fixed", "controller_options": {"k": 4}},
    )
    assert "error" not in result, result.get("error")
    assert result["proposer"]["drafted"] >= runs  # every request drafted for its second token
    model = AutoModelForCausalLM.from_pretrained(small_vocab, dtype=torch.float64).eval()
    with torch.inference_mode():
        exact = first_tokens_distribution(model, prompt, 2, SamplingParams(temperature=1.0))
    assert_same_distribution([tuple(t) for t in result["tokens"]], exact, false_fail_rate=1e-6)


def test_bad_configuration_fails_at_engine_start(checkpoint: Path, tmp_path: Path) -> None:
    missing = serve(checkpoint, tmp_path, "eesd", options={"head": "/nowhere/head.safetensors"}, max_tokens=4)
    assert "no exit-head file at '/nowhere/head.safetensors'" in missing.get("error", "")
    too_deep = serve(checkpoint, tmp_path, "eesd", options={"exit_layer": 4, "head": None}, max_tokens=4)
    assert "exit_layer=4 is out of range" in too_deep.get("error", "")


def test_in_flight_serving_keeps_the_concurrency_and_the_outputs(checkpoint: Path, tmp_path: Path) -> None:
    """The benchmark's in-flight schedule: at most two requests run at once, the next admitted as
    one finishes; the proposer follows requests that join mid-stream, and greedy outputs stay
    those of plain vLLM running every request at once."""
    common = dict(max_tokens=LIMITS, k="4")
    plain = serve(checkpoint, tmp_path, "plain", **common)
    assert "error" not in plain, plain.get("error")
    assert plain["most_running"] == len(LIMITS)
    capped = serve(checkpoint, tmp_path, "plain", in_flight="2", **common)
    assert "error" not in capped, capped.get("error")
    options = {"exit_layer": EXIT, "head": None, "controller": "fixed", "controller_options": {"k": 4}}
    eesd = serve(checkpoint, tmp_path, "eesd", in_flight="2", options=options, **common)
    assert "error" not in eesd, eesd.get("error")
    assert capped["most_running"] == 2 and eesd["most_running"] == 2
    assert capped["tokens"] == plain["tokens"]
    assert eesd["tokens"] == plain["tokens"]
    assert eesd["proposer"]["accepted"] > 0
    # passes that also ran an admitted request's prompt are told apart, and only they
    assert 0 < eesd["proposer"]["prefill_passes"] < eesd["proposer"]["steps"] / 4
