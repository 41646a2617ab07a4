"""The WebRTC network settings: ICE server URLs with credentials, the port range."""

from __future__ import annotations

import pytest

from duplex_server.webrtc.network import NetworkSettingError, RtcNetwork, ice_server, port_range


def test_a_stun_server_is_its_url():
    server = ice_server("stun:stun.example.com:3478")
    assert (server.urls, server.username, server.credential) == (
        "stun:stun.example.com:3478",
        None,
        None,
    )


def test_a_turn_server_carries_its_credentials_in_the_user_part():
    server = ice_server("turn:alice:s%40cret@turn.example.com:3478?transport=tcp")
    assert server.urls == "turn:turn.example.com:3478?transport=tcp"
    assert (server.username, server.credential) == ("alice", "s@cret")


@pytest.mark.parametrize(
    "text",
    ["http://example.com", "turn:", "stun:user:pass@host:3478", "turn:alice@host:3478"],
)
def test_a_bad_ice_server_is_refused_at_start(text):
    with pytest.raises(NetworkSettingError):
        ice_server(text)


def test_a_port_range_is_low_to_high():
    assert port_range("50000-50100") == (50000, 50100)
    assert port_range("50000") == (50000, 50000)


@pytest.mark.parametrize("text", ["100-200", "50100-50000", "a-b", "50000-70000"])
def test_a_bad_port_range_is_refused(text):
    with pytest.raises(NetworkSettingError):
        port_range(text)


def test_the_host_must_be_an_address():
    with pytest.raises(NetworkSettingError):
        RtcNetwork.from_settings([], "example.com", None)
    network = RtcNetwork.from_settings(["stun:a:1"], "203.0.113.7", "40000-40010")
    assert network.shapes_candidates and network.ports == (40000, 40010)
    assert len(network.configuration().iceServers) == 1


def test_no_servers_means_none_not_aiortcs_default():
    assert RtcNetwork().configuration().iceServers == []
