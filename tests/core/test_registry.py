"""Plug-in discovery through entry points, the allow/block variables, and registration errors."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import sys
import types

import pytest

from eesd_core import hookimpl
from eesd_core.cli import main
from eesd_core.errors import PluginError, PluginLoadError, UnknownPluginError
from eesd_core.registry import Manager, get_manager, reset_manager

BUILT_INS = {"early_exit", "lossless", "llama_family", "baselines"}


def _module(name: str, **hooks: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook_name, fn in hooks.items():
        setattr(module, hook_name, hookimpl(fn))
    sys.modules[name] = module
    return module


def _entry_point(name: str, module: str) -> metadata.EntryPoint:
    return metadata.EntryPoint(name=name, value=module, group="eesd")


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("EESD_LOAD_PLUGINS", raising=False)
    monkeypatch.delenv("EESD_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("EESD_STRICT_PLUGINS", raising=False)
    reset_manager()
    yield
    reset_manager()


def test_built_ins_come_from_the_installed_entry_points() -> None:
    declared = {
        ep.name
        for ep in metadata.entry_points(group="eesd")
        if ep.dist and ep.dist.metadata["Name"] == "eesd"
    }
    assert declared >= BUILT_INS
    info = get_manager().info
    for name in BUILT_INS:
        assert info[name].distribution == "eesd" and info[name].version


def test_plugins_json_lists_the_default_plug_ins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    report = {item["name"]: item for item in json.loads(capsys.readouterr().out)}
    assert report["early_exit"]["provides"] == {"drafter": ["early_exit"], "command": ["distill"]}
    assert report["lossless"]["provides"] == {"verifier": ["lossless"]}
    assert "fixed" in report["baselines"]["provides"]["controller"]
    assert report["lossless"]["distribution"] == "eesd"
    assert "eesd_register_verifiers" in report["lossless"]["hooks"]


def test_import_failure_names_the_entry_point_and_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EESD_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="'broken'.*eesd_no_such_module.*strict"):
        Manager().load_entry_points([_entry_point("broken", "eesd_no_such_module")])


def _with_broken_entry_point(monkeypatch: pytest.MonkeyPatch, name: str, module: str) -> None:
    installed = list(metadata.entry_points(group="eesd"))
    monkeypatch.setattr(metadata, "entry_points", lambda group: [*installed, _entry_point(name, module)])


def test_a_plug_in_that_fails_to_import_is_left_out_and_the_rest_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _with_broken_entry_point(monkeypatch, "broken", "eesd_no_such_module")
    with pytest.warns(RuntimeWarning, match="'broken'.*eesd_no_such_module.*EESD_DISABLE_PLUGINS=broken"):
        manager = get_manager()
    assert "broken" in manager.broken and "broken" not in manager.info
    assert set(manager.info) >= BUILT_INS
    with pytest.raises(UnknownPluginError, match="left out for errors: broken"):
        manager.registry("controller").get("from_the_broken_one")


def test_eesd_plugins_lists_a_broken_plug_in_and_exits_0_unless_strict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _with_broken_entry_point(monkeypatch, "broken", "eesd_no_such_module")
    with pytest.warns(RuntimeWarning):
        assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "BROKEN" in out and "eesd_no_such_module" in out and "lossless" in out
    assert main(["plugins", "--strict"]) == 1
    capsys.readouterr()
    assert main(["plugins", "--json"]) == 0
    report = {item["name"]: item for item in json.loads(capsys.readouterr().out)}
    assert "ModuleNotFoundError" in report["broken"]["broken"]


def test_a_broken_plug_in_leaves_the_other_commands_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_broken_entry_point(monkeypatch, "broken", "eesd_no_such_module")
    from eesd_core.cli import build_parser

    with pytest.warns(RuntimeWarning):
        parser = build_parser()
    assert parser.parse_args(["models", "list"]).func is not None


def test_a_registration_hook_that_raises_is_named_and_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    def register(register):  # noqa: ANN001, ANN202
        raise RuntimeError("the registration went wrong")

    manager = Manager()
    manager.register(_module("eesd_test_raises", eesd_register_controllers=register), "raiser")
    with pytest.warns(RuntimeWarning, match="'raiser' failed in eesd_register_controllers.*went wrong"):
        assert manager.registry("controller").names() == []
    assert "raiser" in manager.broken and "raiser" not in manager.info
    monkeypatch.setenv("EESD_STRICT_PLUGINS", "1")
    strict = Manager()
    strict.register(_module("eesd_test_raises", eesd_register_controllers=register), "raiser")
    with pytest.raises(PluginLoadError, match="'raiser'.*RuntimeError: the registration went wrong"):
        strict.registry("controller")


@pytest.mark.parametrize("variable", ["EESD_LOAD_PLUGINS", "EESD_DISABLE_PLUGINS"])
def test_a_filter_naming_no_plug_in_says_so(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv(variable, "lossless,nonsense")
    with pytest.raises(PluginLoadError, match=f"{variable} names 'nonsense'.*Installed plug-ins: .*lossless"):
        get_manager()


def test_duplicate_names_name_both_plug_ins() -> None:
    from eesd_baselines import FixedK

    def register(register):  # noqa: ANN001, ANN202
        register.add("twin", FixedK)

    manager = Manager()
    manager.register(_module("eesd_test_a", eesd_register_controllers=register), "first")
    manager.register(_module("eesd_test_b", eesd_register_controllers=register), "second")
    with pytest.warns(RuntimeWarning, match="'first'.*'second'|'second'.*'first'"):
        assert manager.registry("controller").names() == ["twin"]
    assert len(manager.broken) == 1


@pytest.mark.parametrize(
    "name, factory, options, message",
    [
        ("Bad Name", object, None, "lowercase"),
        ("ok", 42, None, "callable"),
        ("ok", object, dict, "pydantic"),
    ],
)
def test_malformed_registrations_fail_at_once(
    name: str, factory: object, options: object, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EESD_STRICT_PLUGINS", "1")

    def register(register):  # noqa: ANN001, ANN202
        register.add(name, factory, options=options)

    manager = Manager()
    manager.register(_module("eesd_test_bad", eesd_register_verifiers=register), "culprit")
    with pytest.raises(PluginError, match=f"culprit.*{message}"):
        manager.registry("verifier")


def test_unknown_hook_is_rejected() -> None:
    module = types.ModuleType("eesd_test_typo")
    module.eesd_register_controlers = hookimpl(lambda register: None)
    with pytest.raises(PluginLoadError, match="typo"):
        manager = Manager()
        manager.register(module, "typo")
        manager.check_pending()


def test_allow_and_block_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EESD_DISABLE_PLUGINS", "baselines")
    assert "baselines" not in get_manager().info
    reset_manager()
    monkeypatch.delenv("EESD_DISABLE_PLUGINS")
    monkeypatch.setenv("EESD_LOAD_PLUGINS", "lossless, llama_family")
    assert set(get_manager().info) == {"lossless", "llama_family"}
    with pytest.raises(UnknownPluginError, match="No drafter named 'early_exit'"):
        get_manager().registry("drafter").get("early_exit")


def test_unknown_plug_in_lists_the_registered_ones() -> None:
    with pytest.raises(UnknownPluginError, match="Registered verifiers: lossless"):
        get_manager().registry("verifier").get("losless")


class _Stops:
    """A controller that never drafts (its options: none)."""

    def start(self, request):  # noqa: ANN001, ANN201
        return None

    def begin_round(self, state, round) -> None:  # noqa: ANN001
        pass

    def should_continue(self, state, step) -> bool:  # noqa: ANN001
        return False

    def update(self, state, outcomes) -> None:  # noqa: ANN001
        pass


def test_a_controller_registered_in_process_is_used_and_replaced_on_a_second_registration() -> None:
    from tinymodels import make_tiny

    import eesd_core
    from eesd_core import SpeculativeDecoder

    eesd_core.register("controller", "in_notebook", _Stops)
    decoder = SpeculativeDecoder(
        make_tiny("llama", 0), drafter_options={"exit_layer": 2}, controller="in_notebook"
    )
    assert isinstance(decoder.controller, _Stops)
    assert decoder.generate([1, 2, 3], max_new_tokens=4).stats.drafted == 0
    eesd_core.register("controller", "in_notebook", lambda: _Stops())  # a second registration replaces it
    assert (
        get_manager().registry("controller").get("in_notebook").plugin == "in-process controller in_notebook"
    )


@pytest.mark.parametrize(
    "kind, name, factory, error, message",
    [
        ("controllr", "x", _Stops, PluginError, "kind must be one of drafter, controller"),
        ("controller", "Not A Name", _Stops, PluginError, "lowercase"),
        ("controller", "x", 42, PluginError, "must be callable"),
        ("controller", "x", type("NoUpdate", (), {"start": lambda s, r: None}), PluginError, "no update"),
        ("controller", "thompson", _Stops, PluginError, "'thompson' is registered already"),
    ],
)
def test_in_process_registration_is_checked_at_once(kind, name, factory, error, message) -> None:  # noqa: ANN001
    import eesd_core

    with pytest.raises(error, match=message):
        eesd_core.register(kind, name, factory)
    assert "x" not in get_manager().registry("controller").names()


def test_bad_json_options_say_what_is_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    for bad, said in (("{k: 4}", "is not JSON"), ("[1]", "is JSON but not an object")):
        with pytest.raises(SystemExit):
            main(["generate", "hi", "--controller-options", bad])
        err = capsys.readouterr().err
        assert "--controller-options" in err and said in err and '{"k": 4}' in err


def test_generate_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    assert "(default: 256)" in out and "(default: thompson)" in out and "(default: cpu)" in out


def test_an_unknown_generate_keyword_lists_every_valid_one() -> None:
    from tinymodels import make_tiny

    from eesd_core import SpeculativeDecoder
    from eesd_core.errors import InputError

    decoder = SpeculativeDecoder(make_tiny("llama", 0), drafter=None, controller="fixed")
    with pytest.raises(InputError, match="unknown option 'max_tokens'") as raised:
        decoder.generate([1, 2], max_tokens=3)
    for keyword in (
        "attention_mask",
        "eos_token_id",
        "max_new_tokens",
        "pad_token_id",
        "rng",
        "seed",
        "top_p",
    ):
        assert keyword in str(raised.value)


def test_eesd_plugins_says_which_commands_each_tool_adds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    report = {item["name"]: item for item in json.loads(capsys.readouterr().out)}
    assert {"bench", "demo"} <= set(report["bench"]["provides"]["command"])
    assert report["models"]["provides"]["command"] == ["models"]
    assert main(["plugins"]) == 0
    assert "hooks: eesd_linear_products" in capsys.readouterr().out
