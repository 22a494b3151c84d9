"""The plug-ins' command lines: defaults in every --help, plain-text descriptions, JSON option errors."""

from __future__ import annotations

import argparse

import pytest
from eesd_bench.helptext import DefaultsFormatter, plain_text

from eesd_core.cli import main

COMMANDS = [
    ["bench"],
    ["bench-batch"],
    ["demo"],
    ["models", "fetch"],
    ["models", "list"],
    ["models", "verify"],
]


def help_of(command: list[str], capsys) -> str:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_help_shows_defaults_and_no_markup(command, capsys) -> None:
    text = help_of(command, capsys)
    assert "default" in text
    assert "``" not in text and ":mod:" not in text and "(default: None)" not in text


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (["bench"], "--max-new-tokens MAX_NEW_TOKENS (default: 128)"),
        (["bench"], "--group-by {task,category} (default: task)"),
        (["bench-batch"], "--repeats REPEATS timed calls per method and batch size (default: 3)"),
        (["demo"], "--repeats REPEATS timed rounds of every method on every prompt (default: 3)"),
        (["demo"], "(default: thompson)"),
        (["models", "fetch"], "(default: smollm2-135m-instruct)"),
        (["models", "fetch"], "--dtype {float32,bfloat16} of the saved checkpoint (default: float32)"),
    ],
)
def test_help_names_the_default(command, shown, capsys) -> None:
    assert shown in help_of(command, capsys)


def test_a_help_that_speaks_of_its_default_is_left_alone() -> None:
    parser = argparse.ArgumentParser(formatter_class=DefaultsFormatter)
    parser.add_argument("--cache", default=None, help="where (default: eesd's cache)")
    parser.add_argument("--k", type=int, default=4, help="how many")
    text = " ".join(parser.format_help().split())
    assert "where (default: eesd's cache)" in text and "how many (default: 4)" in text
    assert text.count("default") == 2


def test_plain_text_drops_restructured_text_markup() -> None:
    doc = "``eesd bench``: see :mod:`eesd_bench.methods` and :func:`~eesd_core.tools.encode_prompt`."
    assert plain_text(doc) == "eesd bench: see eesd_bench.methods and eesd_core.tools.encode_prompt."


@pytest.mark.parametrize("option", ["--controller-options", "--drafter-options"])
@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("{decay: 0.8}", "'{decay: 0.8}' is not JSON (Expecting property name enclosed in double quotes"),
        ("[1, 2]", "'[1, 2]' is JSON but not an object"),
    ],
)
def test_a_bad_json_option_says_which_option_what_was_wrong_and_how_to_write_it(
    option, value, says, capsys
) -> None:
    with pytest.raises(SystemExit):
        main(["demo", option, value])
    err = " ".join(capsys.readouterr().err.split())
    assert f"argument {option}: {says}" in err
    assert "write e.g. '{" in err
    assert "invalid" not in err
