"""Bad configuration and bad arguments raise EESDError subclasses whose messages say what to do."""

from __future__ import annotations

import pytest
import torch
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.errors import ConfigError, EESDError, InputError, UnknownPluginError, UnsupportedModelError


@pytest.fixture(scope="module")
def model():
    return make_tiny("llama", 0)


@pytest.fixture(scope="module")
def decoder(model):
    return SpeculativeDecoder(
        model, drafter="early_exit", drafter_options={"exit_layer": 2}, controller="fixed"
    )


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(drafter="early_exitt"), UnknownPluginError, "No drafter named 'early_exitt'.*early_exit"),
        (dict(controller="nope"), UnknownPluginError, "No controller named 'nope'"),
        (dict(verifier="nope"), UnknownPluginError, "No verifier named 'nope'"),
        (
            dict(drafter_options={"exit_layr": 2}),
            ConfigError,
            "unknown option 'exit_layr'.*Valid options: exit_layer, head",
        ),
        (dict(controller_options={"kk": 2}), ConfigError, "unknown option 'kk'"),
        (dict(controller_options={"k": -1}), ConfigError, "k: Input should be greater than or equal to 0"),
        (dict(drafter_options={"exit_layer": 0}), ConfigError, "exit_layer must be at least 1"),
        (dict(drafter_options={"exit_layer": 4}), ConfigError, r"choose 1 <= exit_layer <= 3"),
        (dict(drafter_options={"exit_layer": 99}), ConfigError, "out of range for a model of 4 layers"),
        (dict(max_draft_tokens=0), ConfigError, "max_draft_tokens"),
        (dict(verifier_options={"x": 1}), ConfigError, "unknown option 'x'"),
        (dict(drafter_options={"head": "/no/such/head.safetensors"}), EESDError, "does not exist"),
    ],
)
def test_bad_configuration(model, kwargs: dict, error: type, message: str) -> None:
    options = dict(drafter="early_exit", drafter_options={"exit_layer": 2}, controller="fixed")
    options.update(kwargs)
    with pytest.raises(error, match=message):
        SpeculativeDecoder(model, **options)


@pytest.mark.parametrize(
    "ids, kwargs, message",
    [
        ([], {}, "prompt is empty"),
        (torch.empty(1, 0, dtype=torch.long), {}, "prompt is empty"),
        ([1, 2], dict(max_new_tokens=-3), "max_new_tokens: Input should be greater than 0"),
        ([1, 2], dict(max_new_tokens=0), "max_new_tokens"),
        ([1, 2], dict(temperature=-0.5), "temperature"),
        ([1, 2], dict(top_p=0.0), "top_p"),
        ([1, 2], dict(top_p=1.5), "top_p"),
        ([1, 2], dict(top_k=-1), "top_k"),
        ([1, 2], dict(temprature=1.0), "unknown option 'temprature'"),
        ([1, 2000], {}, r"Token id 2000 is not an integer in \[0, 97\)"),
        ([1, -1], {}, "Token id -1"),
        (torch.tensor([[1.0, 2.0]]), {}, "integer token ids"),
        # batches
        (
            torch.ones(2, 3, dtype=torch.long),
            dict(attention_mask=torch.ones(2, 4)),
            "one mask entry per token",
        ),
        (
            torch.ones(2, 3, dtype=torch.long),
            dict(attention_mask=torch.tensor([[1, 1, 0], [1, 1, 1]])),
            "right padding",
        ),
        (
            torch.ones(2, 3, dtype=torch.long),
            dict(attention_mask=torch.tensor([[0, 0, 0], [1, 1, 1]])),
            "Row 0 of the batch is empty",
        ),
        (
            torch.ones(2, 3, dtype=torch.long),
            dict(attention_mask=torch.tensor([[0, 2, 1], [1, 1, 1]])),
            "0 \\(padding\\) and 1",
        ),
        (
            torch.ones(2, 3, dtype=torch.long),
            dict(attention_mask=torch.full((2, 3), 0.5)),
            "0 \\(padding\\) and 1",
        ),
        (torch.ones(0, 3, dtype=torch.long), dict(attention_mask=torch.ones(0, 3)), "batch is empty"),
        ([[1, 2], []], {}, "Row 1 of the batch is empty"),
        ([[1, 2], [3, 2000]], {}, "Row 1 of the batch: Token id 2000"),
        ([[1, 2], [1] * 500], dict(max_new_tokens=20), "exceeds the model's context of 512"),
        ([[1, 2], [3]], dict(attention_mask=torch.ones(2, 2)), "padded by eesd"),
        ([[1, 2], [3]], dict(seed=[1, 2, 3]), "a list of 2 ints"),
        ([[1, 2], [3]], dict(rng=[None]), "a list of 2 RandomSources"),
        ([1, 2], dict(seed=[1, 2]), "one value for one sequence"),
        ([1, 2], dict(attention_mask=[1, 1]), "attention_mask goes with input_ids of shape"),
        ([1, 2], dict(max_new_tokens=10_000), "exceeds the model's context of 512"),
        ("hello", {}, "tensor or a list of ints"),
        # kinds as well as ranges: a bool is not a number, seeds fit a torch generator
        ([1, 2], dict(max_new_tokens=True), "max_new_tokens takes numbers, not the bool True"),
        ([1, 2], dict(temperature=False), "temperature takes numbers, not the bool False"),
        ([1, 2], dict(eos_token_id=[True]), "eos_token_id takes numbers, not the bool True"),
        ([1, 2], dict(seed=2**64), "seed 18446744073709551616 does not fit in 64 bits"),
        ([[1, 2], [3]], dict(seed=2**64 - 1), "does not fit in 64 bits .row b of a batch"),
        ([[1, 2], [3]], dict(pad_token_id="x"), "pad_token_id 'x' is not an integer in"),
        ([[1, 2], [3]], dict(pad_token_id=1.5), "pad_token_id 1.5 is not an integer in"),
        ([[1, 2], [3]], dict(pad_token_id=97), "pad_token_id 97 is not an integer in .0, 97"),
        ([[1, 2], [3]], dict(pad_token_id=True), "pad_token_id True"),
        (torch.ones(2, 3, dtype=torch.long), dict(attention_mask="abc"), "attention_mask must be a tensor"),
    ],
)
def test_bad_arguments(decoder, ids, kwargs: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        decoder.generate(ids, **kwargs)


def test_numpy_and_torch_scalars_count_as_numbers(decoder) -> None:
    import numpy as np

    plain = decoder.generate([[1, 2], [3]], max_new_tokens=4, temperature=1.0, seed=[5, 6], pad_token_id=0)
    scalars = decoder.generate(
        [[np.int64(1), 2], [torch.tensor(3).item()]],
        max_new_tokens=np.int64(4),
        temperature=np.float32(1.0),
        seed=[np.int64(5), torch.tensor(6)],
        pad_token_id=np.int32(0),
    )
    assert all(torch.equal(a, b) for a, b in zip(plain.sequences, scalars.sequences, strict=True))


def test_a_temperature_that_overflows_the_logits_is_explained() -> None:
    model32 = make_tiny("llama", 0, dtype=torch.float32)
    decoder = SpeculativeDecoder(
        model32, drafter="early_exit", drafter_options={"exit_layer": 2}, controller="fixed"
    )
    with pytest.raises(InputError, match="temperature=1e-40 is so small that logits / temperature overflow"):
        decoder.generate([1, 2], max_new_tokens=3, temperature=1e-40, seed=0)
    assert decoder.generate([1, 2], max_new_tokens=3, temperature=1e-3, seed=0).sequences.shape == (1, 5)


def test_a_damaged_checkpoint_is_an_input_error_naming_it(tmp_path) -> None:
    model = make_tiny("llama", 0, dtype=torch.float32)
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(InputError, match=f"{tmp_path}.*SafetensorError.*whole safetensors weights"):
        SpeculativeDecoder.from_pretrained(str(tmp_path), controller="fixed")
    weights.write_bytes(b"")
    with pytest.raises(InputError, match="SafetensorError"):
        SpeculativeDecoder.from_pretrained(str(tmp_path), controller="fixed")


def test_unsupported_architecture_mentions_a_plug_in_filter(monkeypatch: pytest.MonkeyPatch, model) -> None:
    from eesd_core.registry import reset_manager

    monkeypatch.setenv("EESD_LOAD_PLUGINS", "lossless,baselines")
    reset_manager()
    try:
        with pytest.raises(UnsupportedModelError, match="filtered by EESD_LOAD_PLUGINS='lossless,baselines'"):
            SpeculativeDecoder(model, drafter=None, controller="fixed")
    finally:
        reset_manager()


def test_decoder_stays_usable_after_an_error(decoder) -> None:
    with pytest.raises(InputError):
        decoder.generate([], max_new_tokens=5)
    assert decoder.generate([3, 4], max_new_tokens=5).sequences.shape == (1, 7)


def test_unsupported_architecture_names_the_supported_ones() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(UnsupportedModelError, match="'gpt2'.*llama, mistral, qwen2, qwen3"):
        SpeculativeDecoder(gpt2, controller="fixed")


def test_missing_checkpoint_is_an_input_error(tmp_path) -> None:
    with pytest.raises(InputError, match="config.json"):
        SpeculativeDecoder.from_pretrained(str(tmp_path / "nowhere"), controller="fixed")


def test_a_padded_batch_without_its_mask_is_warned_about() -> None:
    """Rows that start with the pad token, beside rows that do not, look like a padded batch whose
    attention_mask was forgotten: the padding would be decoded as prompt."""
    import warnings

    decoder = SpeculativeDecoder(make_tiny("llama"), drafter=None)  # pad_token_id 0
    with pytest.warns(UserWarning, match="start with the pad token.*Pass attention_mask"):
        decoder.generate(torch.tensor([[0, 0, 5, 6], [1, 4, 5, 6]]), max_new_tokens=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
        decoder.generate(torch.tensor([[0, 0, 5, 6], [1, 4, 5, 6]]), attention_mask=mask, max_new_tokens=2)
        decoder.generate(torch.tensor([[0, 3, 5], [0, 4, 5]]), max_new_tokens=2)  # every row: no padding
