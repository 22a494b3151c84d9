"""On the real Qwen2.5-Coder-1.5B-Instruct, eesd's greedy output equals transformers' token for token.

The model is a 1.1 GB download and a 7.1 GB float32 checkpoint, so the suite does not fetch it:
these tests run where ``eesd models fetch qwen2.5-coder-1.5b-instruct`` has been run, and say so
when they skip. Two short code prompts keep them to a few minutes on a 2-core CPU, with torch's
threads on every core as users run it. The products of short passes are calibrated once per
machine and kept where eesd keeps them for users (the first run spends about a minute timing
passes of this model, later runs none).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.usefixtures("real_checkpoint")]

NAME = "qwen2.5-coder-1.5b-instruct"
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Fix this code: def mean(xs): return sum(xs) / len(x)",
]
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def qwen():
    from eesd_models.fetch import MARKER, default_cache_dir, fetch_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (default_cache_dir() / "models" / NAME / MARKER).is_file():
        pytest.skip(f"{NAME} is not cached here: run `eesd models fetch {NAME}` to include these tests")
    path = fetch_model(NAME, progress=False)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"]
        for p in PROMPTS
    ]
    with torch.inference_mode():
        expected = [model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False) for ids in prompts]
    return model, tok, prompts, expected


@pytest.mark.parametrize(
    "options",
    [
        dict(drafter=None),
        dict(drafter="early_exit", controller="thompson"),
        dict(
            drafter="early_exit",
            drafter_options={"exit_layer": 20, "head": None},
            controller="fixed",
            controller_options={"k": 3},
        ),
        dict(drafter="early_exit", controller="fixed", controller_options={"k": 3}),
        dict(drafter="prompt_lookup", controller="thompson"),
    ],
    ids=["plain", "default", "untrained-n20-fixed3", "shipped-head-fixed3", "prompt-lookup"],
)
def test_greedy_equals_transformers(qwen, options: dict) -> None:
    from eesd_core import SpeculativeDecoder

    model, tok, prompts, expected = qwen
    dec = SpeculativeDecoder(model, tokenizer=tok, **options)
    if options.get("drafter") == "early_exit" and "drafter_options" not in options:
        assert dec.drafter.head_path is not None, "the shipped exit head for this model was not found"
    for ids, want in zip(prompts, expected, strict=True):
        out = dec.generate(ids, max_new_tokens=NEW_TOKENS)
        assert out.sequences.tolist() == want.tolist(), tok.decode(ids[0])


def test_a_batch_of_both_prompts_equals_each_alone(qwen) -> None:
    from eesd_core import SpeculativeDecoder

    model, tok, prompts, expected = qwen
    dec = SpeculativeDecoder(model, tokenizer=tok, max_draft_tokens=4)  # passes over 2 x 5 rows at most
    out = dec.generate([ids[0].tolist() for ids in prompts], max_new_tokens=NEW_TOKENS)
    assert [row.tolist() for row in out.sequences] == [want[0].tolist() for want in expected]
