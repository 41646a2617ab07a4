"""``serve``'s settings from flags, the environment and a TOML file.

Precedence: flag > ``DUPLEX_SERVER_<OPTION>`` > ``--config`` file > default,
for every option of the parser (not a list kept here), each value through
its flag's own type and choices; and what a file or variable gets wrong is
refused naming the key and where it came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest

from duplex_server import cli, config_sources, settings
from duplex_server.config import ServerConfig

ROOT = Path(__file__).resolve().parent.parent


def serve_options() -> dict[str, argparse.Action]:
    _, serve_parser = cli.parsers()
    return config_sources.options(serve_parser)


def toml_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "duplex-server.toml"
    path.write_text(text)
    return str(path)


def test_flag_over_environment_over_file_over_default(tmp_path):
    config_file = toml_file(tmp_path, "max_sessions = 100\nidle_ttl_s = 60\nhost = '0.0.0.0'\n")
    environ = {"DUPLEX_SERVER_MAX_SESSIONS": "200", "DUPLEX_SERVER_IDLE_TTL_S": "90"}

    assert cli.serve_config([], {}).max_sessions == ServerConfig.max_sessions
    from_file = cli.serve_config(["--config", config_file], {})
    assert (from_file.max_sessions, from_file.idle_ttl_s) == (100, 60.0)
    from_env = cli.serve_config(["--config", config_file], environ)
    assert (from_env.max_sessions, from_env.idle_ttl_s, from_env.host) == (200, 90.0, "0.0.0.0")
    from_flag = cli.serve_config(["--config", config_file, "--max-sessions", "300"], environ)
    assert (from_flag.max_sessions, from_flag.idle_ttl_s) == (300, 90.0)
    # what none of them sets keeps its default
    assert from_flag.port == ServerConfig.port


def test_the_config_file_may_come_from_the_environment(tmp_path):
    config_file = toml_file(tmp_path, "max_sessions = 100\n")
    other = tmp_path / "other.toml"
    other.write_text("max_sessions = 5\n")
    environ = {"DUPLEX_SERVER_CONFIG": config_file}
    assert cli.serve_config([], environ).max_sessions == 100
    assert cli.serve_config(["--config", str(other)], environ).max_sessions == 5


def test_every_serve_option_is_a_server_setting():
    """``_config`` passes each option to the ServerConfig field of its name:
    an option without one would be parsed and then dropped."""
    fields = {field.name for field in dataclasses.fields(ServerConfig)}
    assert set(serve_options()) - {config_sources.CONFIG_OPTION} <= fields


def _sample(action: argparse.Action) -> tuple[str, object, object]:
    """A value unlike the default, for any option: (environment text, TOML
    value, what the setting becomes), within the setting's declared bounds."""
    if action.nargs == 0:
        return "true", True, not action.default
    if action.choices is not None:
        choice = [c for c in action.choices if c != action.default][-1]
        return choice, choice, choice
    if isinstance(action.default, list):
        return "a.example,b.example", ["a.example", "b.example"], ["a.example", "b.example"]
    option = DECLARED[action.dest]
    if option.kind is int or option.kind is float:
        number = _number_unlike(option)
        return str(number), number, number
    text = f"{action.dest}-set-from-outside"  # long enough for an API key
    return text, text, text


DECLARED = {option.name: option for option in settings.options(ServerConfig)}


def _number_unlike(option: settings.Option) -> int | float:
    """The default moved by 7 (1.5 for a float), or halved where that would
    leave the declared range (a share in (0, 1], a port)."""
    default = option.default if isinstance(option.default, int | float) else 0
    step = 7 if option.kind is int else 1.5
    number = default + step
    maximum = option.setting.maximum
    if maximum is not None and number > maximum:
        number = default // 2 if option.kind is int else default / 2
    return number


def test_every_option_is_settable_by_environment_and_by_file(tmp_path):
    options = {
        dest: action
        for dest, action in serve_options().items()
        if dest != config_sources.CONFIG_OPTION
    }
    samples = {dest: _sample(action) for dest, action in options.items()}
    # JSON's scalars and lists of strings are TOML too
    lines = [f"{dest} = {json.dumps(toml_value)}" for dest, (_, toml_value, _) in samples.items()]
    config_file = toml_file(tmp_path, "\n".join(lines) + "\n")
    environ = {config_sources.env_name(dest): text for dest, (text, _, _) in samples.items()}

    for source, argv, env in (
        ("file", ["--config", config_file], {}),
        ("environment", [], environ),
    ):
        config = cli.serve_config(argv, env)
        for dest, (_, _, expected) in samples.items():
            assert getattr(config, dest) == expected, f"{dest} from the {source}"


def test_environment_names_follow_the_flags():
    for dest, action in serve_options().items():
        flag = next(s for s in action.option_strings if s.startswith("--"))
        assert config_sources.env_name(dest) == "DUPLEX_SERVER_" + flag[2:].upper().replace(
            "-", "_"
        )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_session = 3\n", "unknown key 'max_session' (did you mean 'max_sessions'?)"),
        ("max-sessions = 3\n", "spelled with underscores: 'max_sessions'"),
        ('port = "8000"\n', "key 'port': expected an integer, got '8000' (a string)"),
        ("host = 5\n", "key 'host': expected a string, got 5 (an integer)"),
        ("max_sessions = 2.5\n", "key 'max_sessions': invalid int value '2.5'"),
        ("ws_per_message_deflate = 1\n", "key 'ws_per_message_deflate': expected true or false"),
        ("durability = 'never'\n", "key 'durability': 'never' is not one of fsync-per-batch"),
        ("ended_sessions_kept = 0\n", "key 'ended_sessions_kept': must be at least 1"),
        ("text_delta_interval_ms = 5000\n", "5000: give milliseconds in [0, 1000.0]"),
        ("text_delta_interval_ms = -1\n", "-1: give milliseconds in [0, 1000.0]"),
        ("allowed_hosts = [1, 2]\n", "key 'allowed_hosts': [1, 2] is not a value"),
        ("[serve]\nport = 1\n", "unknown key 'serve'"),
        ("config = 'x.toml'\n", "cannot name another"),
        ("port = \n", "not TOML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path, text, message):
    config_file = toml_file(tmp_path, text)
    with pytest.raises(SystemExit) as refused:
        cli.serve_config(["--config", config_file], {})
    assert str(refused.value).startswith(f"duplex-server: config file {config_file}")
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DUPLEX_SERVER_PORT", "tcp://10.0.0.1:8000", "invalid int value 'tcp://10.0.0.1:8000'"),
        ("DUPLEX_SERVER_LOG_FORMAT", "yaml", "'yaml' is not one of text, json"),
        ("DUPLEX_SERVER_WS_PER_MESSAGE_DEFLATE", "maybe", "neither true"),
        ("DUPLEX_SERVER_API_KEY", "short", "at least 16 characters"),
    ],
)
def test_a_bad_variable_is_refused_naming_it(name, value, message):
    with pytest.raises(SystemExit) as refused:
        cli.serve_config([], {name: value})
    assert str(refused.value).startswith(f"duplex-server: environment variable {name}: ")
    assert message in str(refused.value)


def test_a_refused_api_key_is_not_echoed():
    with pytest.raises(SystemExit) as refused:
        cli.serve_config([], {"DUPLEX_SERVER_API_KEY": "hunter2-short"})
    assert "hunter2" not in str(refused.value)


def test_a_missing_config_file_is_refused():
    with pytest.raises(SystemExit, match="config file /nonexistent.toml: cannot read it"):
        cli.serve_config(["--config", "/nonexistent.toml"], {})


@pytest.mark.parametrize(("text", "expected"), [("1", True), ("On", True), ("no", False)])
def test_switches_read_the_usual_words(text, expected):
    config = cli.serve_config([], {"DUPLEX_SERVER_WS_PER_MESSAGE_DEFLATE": text})
    assert config.ws_per_message_deflate is expected


def test_other_variables_of_the_prefix_are_left_alone():
    """Kubernetes sets DUPLEX_SERVER_SERVICE_HOST for a Service of that name."""
    config = cli.serve_config([], {"DUPLEX_SERVER_SERVICE_HOST": "10.0.0.1"})
    assert config.host == ServerConfig.host


def test_a_file_list_may_be_one_comma_separated_string(tmp_path):
    config_file = toml_file(tmp_path, 'allowed_origins = "https://a.example, https://b.example"\n')
    config = cli.serve_config(["--config", config_file], {})
    assert config.allowed_origins == ["https://a.example", "https://b.example"]


def test_the_deploy_examples_are_valid():
    """deploy/config.toml loads, and every variable deploy/duplex-server.env
    names (set or commented out) is a serve option's."""
    config = cli.serve_config(["--config", str(ROOT / "deploy" / "config.toml")], {})
    assert config.log_format == "json"
    env_file = (ROOT / "deploy" / "duplex-server.env").read_text()
    names = re.findall(r"^#?(DUPLEX_SERVER_\w+)=", env_file, re.MULTILINE)
    known = {config_sources.env_name(dest) for dest in serve_options()}
    assert names and set(names) <= known
