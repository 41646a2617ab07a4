"""Each ``serve`` setting declared once (``duplex_server/config.py``), and
what derives from it: flags in ``--help`` groups, bounds checked the same
way from a flag, a variable and a file, ``--version``, and the options
reference in ``docs/reference/options.md``."""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from duplex_server import cli, config_sources, settings
from duplex_server.config import ServerConfig

ROOT = Path(__file__).resolve().parent.parent
DECLARED = settings.options(ServerConfig)
BY_NAME = {option.name: option for option in DECLARED}


def test_every_declared_setting_has_a_group_and_help():
    assert len(DECLARED) > 50
    for option in DECLARED:
        assert option.group in settings.GROUPS, option.name
        assert option.setting.help.strip(), option.name


def test_every_declared_setting_is_a_serve_flag_and_nothing_else_is():
    _, serve_parser = cli.parsers()
    flags = set(config_sources.options(serve_parser))
    assert flags - {config_sources.CONFIG_OPTION} == set(BY_NAME)


def test_serve_help_shows_the_groups_in_order():
    _, serve_parser = cli.parsers()
    text = serve_parser.format_help()
    positions = [text.index(f"\n{group.title}:\n") for group in settings.GROUPS]
    assert positions == sorted(positions)
    assert "--max-sessions" in text.split("\nlimits:\n", 1)[1].split("\nbatch:\n", 1)[0]


def test_the_options_reference_is_what_the_code_generates():
    """Edit config.py, then ``duplex-server options --write``."""
    assert (ROOT / settings.DOCS_PATH).read_text() == settings.markdown(DECLARED)


def test_the_reference_lists_every_option_with_its_variable_and_default():
    text = settings.markdown(DECLARED)
    for option in DECLARED:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{option.flag}` |"))
        assert f"`{option.env}`" in row
        assert f"`{option.shown_default()}`" in row


def test_the_options_subcommand_prints_the_reference(capsys):
    cli.main(["options", "--markdown"])
    assert capsys.readouterr().out == settings.markdown(DECLARED)


def test_version_names_the_installed_package():
    result = subprocess.run(
        [sys.executable, "-m", "duplex_server.cli", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert result.stdout.strip().endswith(importlib.metadata.version("duplex-server"))


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("port", "0", 0),
        ("port", "65535", 65535),
        ("max_sessions", "0", 0),
    ],
)
def test_values_inside_the_bounds_are_taken(name, text, expected):
    assert BY_NAME[name].parse(text) == expected


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("port", "65536", "in [0, 65535]"),
        ("port", "-1", "in [0, 65535]"),
        ("port", "eighty", "invalid int value 'eighty'"),
        ("llm_max_num_seqs", "0", "at least 1"),
    ],
)
def test_values_outside_the_bounds_are_refused_saying_why(name, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message.replace("[", r"\[")):
        BY_NAME[name].parse(text)


def test_a_bound_is_refused_the_same_way_from_a_flag_a_variable_and_a_file(tmp_path, capsys):
    config_file = tmp_path / "duplex-server.toml"
    config_file.write_text("port = 70000\n")
    refusals = []
    for argv, environ in (
        (["--port", "70000"], {}),
        ([], {"DUPLEX_SERVER_PORT": "70000"}),
        (["--config", str(config_file)], {}),
    ):
        with pytest.raises(SystemExit) as exited:
            cli.serve_config(argv, environ)
        # argparse prints a flag's refusal and exits 2; the environment's and
        # the file's are the exit's message
        refusals.append(capsys.readouterr().err + str(exited.value.code))
    for where, refusal in zip(("--port", "DUPLEX_SERVER_PORT", "port"), refusals, strict=True):
        assert where in refusal and "in [0, 65535]" in refusal, refusal


def test_a_choice_outside_the_list_is_refused():
    choices = next(option for option in DECLARED if option.setting.choices is not None)
    with pytest.raises(argparse.ArgumentTypeError, match="is not one of"):
        choices.parse("no-such-choice")


def test_bounds_read_as_intervals():
    assert BY_NAME["port"].bounds() == "[0, 65535]"
    assert BY_NAME["max_sessions"].bounds() == ">= 0"
    assert BY_NAME["llm_gpu_memory_utilization"].bounds() == "(0, 1]"


def test_environment_names_derive_from_the_setting_name():
    assert settings.env_name("max_sessions") == "DUPLEX_SERVER_MAX_SESSIONS"
    assert all(option.env == settings.env_name(option.name) for option in DECLARED)
