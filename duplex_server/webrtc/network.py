"""Where a call's media flows: ICE servers, the host address, the UDP ports.

``--rtc-ice-servers`` lists STUN and TURN servers (a TURN server relays for
clients whose NAT lets nothing in); ``--rtc-host`` is the address put in
the host candidates (a container's public address, where the server binds
an address no client can reach: 1:1 NAT); ``--rtc-udp-ports`` the range
the media sockets bind in (what a firewall opens).

aiortc has no option for the last two, so :func:`bind_candidates` swaps the
class of the ICE connection aiortc made for the offer (before it gathers)
for :class:`BoundConnection`, which gathers host candidates this way and
leaves STUN, TURN and the checks to aioice. It is done only where one of
them is set; otherwise aiortc runs as shipped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
from urllib.parse import unquote

import aioice
from aioice.candidate import Candidate, candidate_foundation, candidate_priority
from aioice.ice import StunProtocol, server_reflexive_candidate
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection

SCHEMES = ("stun", "turn", "turns")


class NetworkSettingError(ValueError):
    pass


def ice_server(text: str) -> RTCIceServer:
    """``stun:host:port``, ``turn:user:credential@host:port[?transport=tcp]``
    (``turns:`` for TLS): one server, its credentials in the user part."""
    scheme, _, rest = text.partition(":")
    if scheme not in SCHEMES or not rest:
        raise NetworkSettingError(f"{text!r}: an ICE server is stun:, turn: or turns: HOST:PORT")
    credentials, at, address = rest.rpartition("@")
    if not at:
        return RTCIceServer(urls=text)
    username, colon, credential = credentials.partition(":")
    if scheme == "stun" or not colon:
        raise NetworkSettingError(f"{scheme}:…: credentials are turn:USER:CREDENTIAL@HOST:PORT")
    return RTCIceServer(
        urls=f"{scheme}:{address}", username=unquote(username), credential=unquote(credential)
    )


def port_range(text: str) -> tuple[int, int]:
    """``50000-50100``: the UDP ports media sockets bind in."""
    low, dash, high = text.partition("-")
    try:
        first, last = int(low), int(high if dash else low)
    except ValueError:
        raise NetworkSettingError(f"{text!r}: give a port range, LOW-HIGH") from None
    if not 1024 <= first <= last <= 65535:
        raise NetworkSettingError(f"{text!r}: a range within 1024-65535, LOW before HIGH")
    return first, last


@dataclasses.dataclass(frozen=True)
class RtcNetwork:
    ice_servers: tuple[RTCIceServer, ...] = ()
    host: str | None = None  # the address host candidates name
    ports: tuple[int, int] | None = None

    @classmethod
    def from_settings(
        cls, ice_servers: list[str], host: str | None, ports: str | None
    ) -> RtcNetwork:
        if host is not None:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                raise NetworkSettingError(f"--rtc-host {host!r}: give an IP address") from None
        return cls(
            ice_servers=tuple(ice_server(url) for url in ice_servers),
            host=host,
            ports=port_range(ports) if ports else None,
        )

    def configuration(self) -> RTCConfiguration:
        # No servers configured: none (aiortc would default to Google's STUN).
        return RTCConfiguration(iceServers=list(self.ice_servers))

    @property
    def shapes_candidates(self) -> bool:
        return self.host is not None or self.ports is not None


def bind_candidates(pc: RTCPeerConnection, network: RtcNetwork) -> None:
    """Make the offer's ICE connections gather as ``network`` says. Called
    between setRemoteDescription (which makes them) and setLocalDescription
    (which gathers)."""
    if not network.shapes_candidates:
        return
    for transceiver in pc.getTransceivers():
        _bind(transceiver.sender.transport, network)
    if pc.sctp is not None:
        _bind(pc.sctp.transport, network)


def _bind(dtls: object, network: RtcNetwork) -> None:
    if dtls is None:
        return
    gatherer = dtls.transport.iceGatherer  # type: ignore[attr-defined]
    connection = gatherer._connection  # aiortc has no public hook for this
    if not isinstance(connection, BoundConnection):
        connection.__class__ = BoundConnection
        connection.network = network


class BoundConnection(aioice.Connection):
    """aioice's ICE connection, with host candidates bound in a port range
    and named by an advertised address."""

    network: RtcNetwork

    async def get_component_candidates(
        self, component: int, addresses: list[str], timeout: int = 5
    ) -> list[Candidate]:
        bind_to = ["0.0.0.0"] if self.network.host is not None else addresses
        hosts = [
            protocol
            for address in bind_to
            if (protocol := await self._host(component, address)) is not None
        ]
        candidates = [protocol.local_candidate for protocol in hosts]
        if self.stun_server:
            lookups = [server_reflexive_candidate(protocol, self.stun_server) for protocol in hosts]
            found = await asyncio.gather(*lookups, return_exceptions=True)
            candidates += [result[0] for result in found if isinstance(result, tuple)]
        # TURN (and nothing else: no addresses) as aioice does it.
        return candidates + await super().get_component_candidates(component, [], timeout)

    async def _host(self, component: int, address: str) -> StunProtocol | None:
        loop = asyncio.get_running_loop()
        first, last = self.network.ports or (0, 0)
        for port in range(first, last + 1):
            try:
                transport, protocol = await loop.create_datagram_endpoint(
                    lambda: StunProtocol(self), local_addr=(address, port)
                )
            except OSError:
                continue  # taken: the next port
            bound = transport.get_extra_info("sockname")
            host = self.network.host or bound[0]
            protocol.local_candidate = Candidate(
                foundation=candidate_foundation("host", "udp", host),
                component=component,
                transport="udp",
                priority=candidate_priority(component, "host"),
                host=host,
                port=bound[1],
                type="host",
            )
            self._protocols.append(protocol)
            return protocol
        return None
