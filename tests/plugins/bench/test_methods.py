"""Method specs: presets, KIND:key=value strings, groups and missing plug-ins."""

from __future__ import annotations

import pytest
from eesd_bench.methods import GROUPS, PRESETS, expand_methods, parse_method

from eesd_core.errors import ConfigError

ALL = {
    "drafter": ["early_exit", "prompt_lookup"],
    "controller": ["fixed", "thompson"],
    "verifier": ["lossless"],
}


def test_every_preset_parses() -> None:
    for name in PRESETS:
        assert parse_method(name).name == name


def test_custom_spec_sorts_keys_into_decoder_and_plugin_options() -> None:
    spec = parse_method("eesd:drafter=early_exit,controller=fixed,k=4,drafter.head=none,max_draft_tokens=6")
    kwargs = spec.decoder_kwargs(max_draft_tokens=8)
    assert kwargs["controller"] == "fixed" and kwargs["controller_options"] == {"k": 4}
    assert kwargs["drafter_options"] == {"head": None} and kwargs["max_draft_tokens"] == 6
    assert parse_method("eesd_plain").decoder_kwargs()["drafter"] is None
    calibration = parse_method("eesd:controller=thompson,variant=calibration,controller.alpha0=0.5")
    assert calibration.decoder_kwargs()["controller_options"] == {"variant": "calibration", "alpha0": 0.5}


def test_products_go_to_the_model_adapter() -> None:
    kwargs = parse_method("eesd_plain_standard").decoder_kwargs()
    assert kwargs["adapter_options"] == {"products": "standard"} and "products" not in kwargs
    assert "adapter_options" not in parse_method("eesd").decoder_kwargs()
    both = parse_method("eesd:products=standard,skip_padding=false").decoder_kwargs()
    assert both["adapter_options"] == {"products": "standard", "skip_padding": False}
    assert parse_method("eesd_default_dense").decoder_kwargs()["adapter_options"] == {"skip_padding": False}
    dense_plain = parse_method("eesd_plain_dense").decoder_kwargs()
    assert dense_plain["adapter_options"] == {"skip_padding": False} and dense_plain["drafter"] is None


def test_hf_early_exit_takes_an_exit_layer() -> None:
    spec = parse_method("hf_early_exit:exit_layer=8")
    assert spec.kind == "hf_early_exit" and spec.options == {"exit_layer": 8}
    assert spec.plugins() == []


def test_hf_early_exit_without_a_layer_asks_the_early_exit_drafter() -> None:
    assert parse_method("hf_early_exit").plugins() == [("drafter", "early_exit")]
    specs, notes = expand_methods(["default"], {**ALL, "drafter": ["prompt_lookup"]})
    assert "hf_early_exit" not in [s.name for s in specs]
    assert any(n.startswith("hf_early_exit: skipped") for n in notes)


@pytest.mark.parametrize("text", ["vllm", "eesd:k", "eesd:=3"])
def test_bad_specs_say_what_to_do(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_method(text)


def test_groups_skip_what_is_not_registered_and_drop_duplicates() -> None:
    specs, notes = expand_methods(["hf", "controllers", "eesd_fixed_k1"], ALL)
    names = [s.name for s in specs]
    assert names[0] == "hf" and names.count("eesd_fixed_k1") == 1
    assert "eesd_heuristic" not in names and any("eesd_heuristic" in n for n in notes)
    assert set(GROUPS["all"]) >= set(GROUPS["default"])


def test_a_named_method_with_a_missing_plugin_is_an_error() -> None:
    with pytest.raises(ConfigError, match="not registered"):
        expand_methods(["eesd_ucb"], ALL)
