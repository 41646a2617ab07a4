"""The compose files in the repository stay valid: every ``DUPLEX_SERVER_*``
variable they set is a ``serve`` option and each service's settings parse as
the server would parse them at start; the three-tier file's vLLM command is
accepted by vLLM's own argument parser. (No Docker daemon runs here: the
tiers themselves run for real in tests/e2e/test_remote_llm.py and
tests/e2e/test_remote_speech.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from duplex_server import cli, config_sources
from tests.test_config_sources import serve_options
from tests.vllm_support import requires_vllm

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILES = [ROOT / "compose.yaml", ROOT / "deploy" / "compose.three-tier.yaml"]
DEFAULTED = re.compile(r"\$\{(\w+):-([^}]*)\}")


def compose(path: Path) -> dict:
    """The file as compose reads it with no variables set: ``${X:-d}`` is ``d``."""
    return yaml.safe_load(DEFAULTED.sub(lambda match: match.group(2), path.read_text()))


def server_services(path: Path) -> dict[str, dict[str, str]]:
    """The environment of each service that runs duplex-server."""
    services = compose(path)["services"]
    return {
        name: {key: str(value) for key, value in service.get("environment", {}).items()}
        for name, service in services.items()
        if str(service.get("image", "")).startswith("duplex-server")
    }


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda path: path.name)
def test_every_server_setting_in_a_compose_file_is_an_option_that_parses(path):
    known = {config_sources.env_name(dest) for dest in serve_options()}
    services = server_services(path)
    assert services, f"no duplex-server service in {path.name}"
    for name, environment in services.items():
        ours = {key: value for key, value in environment.items() if key.startswith("DUPLEX_")}
        assert set(ours) <= known, (name, set(ours) - known)
        config = cli.serve_config([], ours)  # what the service's server starts with
        assert config.log_format == "json"


def test_the_three_tier_replicas_reach_the_llm_and_speech_tiers():
    services = compose(ROOT / "deploy" / "compose.three-tier.yaml")["services"]
    replicas = services["duplex-server"]
    config = cli.serve_config(
        [], server_services(ROOT / "deploy" / "compose.three-tier.yaml")["duplex-server"]
    )
    assert config.store.startswith("redis://redis:")
    assert config.llm_url == "http://llm:8000/v1" and config.llm_model == "chat"
    served = services["llm"]["command"]
    assert served[served.index("--served-model-name") + 1] == config.llm_model
    assert {"redis", "llm", "speech"} <= set(replicas["depends_on"])
    # the proxy's Caddyfile routes to the replicas' service by name
    caddyfile = (ROOT / "deploy" / "Caddyfile").read_text()
    assert "dynamic a duplex-server 8000" in caddyfile
    assert "./Caddyfile:/etc/caddy/Caddyfile:ro" in services["proxy"]["volumes"]


@requires_vllm
def test_the_three_tier_vllm_command_is_accepted_by_vllms_own_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    command = compose(ROOT / "deploy" / "compose.three-tier.yaml")["services"]["llm"]["command"]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args([str(word) for word in command])
    validate_parsed_serve_args(args)
    assert args.model == "Qwen/Qwen2.5-0.5B-Instruct" and args.served_model_name == ["chat"]
    assert args.enable_auto_tool_choice and args.tool_call_parser == "hermes"
