"""How two instances' connectors reach each other (docs/connector.md#transport).

- The side channel: a loopback TCP server in the instance's scheduler process that hands out
  its workers' handshake payloads (one JSON array, length-prefixed, bounded). Loopback only in
  this version: a payload carries addresses, and nothing here authenticates a peer.
- Notifications: a reader's NIXL transfer carries `notification(request, reader)`; the
  holder parses it (`parse_notification`, bounded and strict) and counts distinct readers.
- Leases: the holder frees a request's blocks when its last reader has notified or its lease
  has expired, never before (`Leases`).
- `Agent`: one NIXL agent per worker (nixl-cu12, imported when one is made), its regions
  registered once with their own memory types.
"""

from __future__ import annotations

import importlib
import json
import socket
import socketserver
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from hisparse_plan.connectors.errors import ConnectorError
from hisparse_plan.connectors.protocol import HandshakePayload, Region
from hisparse_plan.errors import PlanError
from hisparse_plan.models.json_input import load_json_object

LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_MESSAGE: Final = 256 * 2**20
MAX_PAYLOADS: Final = 4096
ASK: Final = b"HPC1 PAYLOADS\n"
NOTE_PREFIX: Final = b"hpc1|"
MAX_NOTE: Final = 1024


def check_loopback(host: str) -> None:
    if host not in LOOPBACK_HOSTS:
        raise ConnectorError(f"side_channel_host: {host!r}; expected a loopback address "
                             f"({sorted(LOOPBACK_HOSTS)}): this version serves payloads on "
                             "one machine only", field="side_channel_host")


class SideChannel:
    """The payload server of one instance: `payloads()` answers each ask (JSON texts)."""

    def __init__(self, host: str, port: int, payloads: Callable[[], Sequence[str]]) -> None:
        check_loopback(host)
        answer = payloads

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(5.0)
                asked = self.request.recv(len(ASK))
                if asked != ASK:
                    return
                body = json.dumps({"payloads": list(answer())}).encode()
                self.request.sendall(struct.pack("!Q", len(body)) + body)

        family = socket.AF_INET6 if ":" in host else socket.AF_INET

        class Server(socketserver.ThreadingTCPServer):
            address_family = family
            allow_reuse_address = True
            daemon_threads = True

        self.server = Server((host, port), Handler)
        self.host, self.port = host, int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                       name="hisparse-plan-side-channel")
        self.thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    check_loopback(host)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConnectorError(f"side channel {address!r}: expected host:port", field="address")
    return host, int(port)


def fetch_payloads(address: str, timeout_s: float = 10.0) -> list[HandshakePayload]:
    """An instance's payloads from its side channel, each read as untrusted JSON."""
    host, port = split_address(address)
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(ASK)
        size = struct.unpack("!Q", _read(sock, 8))[0]
        if size > MAX_MESSAGE:
            raise ConnectorError(f"side channel {address}: a {size}-byte answer; expected at "
                                 f"most {MAX_MESSAGE}", field="payloads")
        body = _read(sock, size)
    try:
        texts = load_json_object(body, what="payloads", max_depth=4).get("payloads")
    except PlanError as error:
        raise ConnectorError(f"side channel {address}: {error}", field="payloads") from None
    if not isinstance(texts, list) or len(texts) > MAX_PAYLOADS or not all(
            isinstance(text, str) for text in texts):
        raise ConnectorError(f"side channel {address}: expected a list of at most "
                             f"{MAX_PAYLOADS} payload texts", field="payloads")
    return [HandshakePayload.model_validate_json(text) for text in texts]


def _read(sock: socket.socket, size: int) -> bytes:
    parts, left = [], size
    while left:
        part = sock.recv(min(left, 2**20))
        if not part:
            raise ConnectorError(f"side channel: closed after {size - left} of {size} bytes",
                                 field="payloads")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def notification(request_id: str, reader: tuple[int, int], readers: int) -> bytes:
    """What a reader's transfer tells the holder: the request, who read, how many read."""
    return NOTE_PREFIX + json.dumps({"request": request_id, "reader": list(reader),
                                     "readers": readers}).encode()


def parse_notification(note: bytes) -> tuple[str, tuple[int, int], int] | None:
    """(request id, reader, readers) of one of our notifications; None for anything else
    (another connector's, or garbage), which is ignored."""
    if not note.startswith(NOTE_PREFIX) or len(note) > MAX_NOTE:
        return None
    try:
        found = load_json_object(note[len(NOTE_PREFIX):], what="notification", max_depth=3)
        if set(found) != {"request", "reader", "readers"}:
            return None
        request, (pp, tp), readers = found["request"], found["reader"], found["readers"]
    except (PlanError, ValueError, TypeError):
        return None
    if not isinstance(request, str) or not all(
            type(x) is int and x >= 0 for x in (pp, tp, readers)):
        return None
    return request, (pp, tp), readers


@dataclass
class Lease:
    expires_at: float
    readers: int | None = None
    """Readers to wait for; None until the first notification says."""
    seen: set[tuple[int, int]] = field(default_factory=set)


@dataclass
class Leases:
    """Requests whose blocks a holder keeps for its readers (module doc)."""

    held: dict[str, Lease] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    """Requests let go: a late or repeated notification for one is ignored (vLLM asserts
    that a finished id is a request it still holds)."""

    def hold(self, request_id: str, expires_at: float, readers: int | None = None) -> None:
        self.released.discard(request_id)
        lease = self.held.setdefault(request_id, Lease(expires_at))
        lease.expires_at = expires_at
        if readers is not None:
            lease.readers = readers
        if lease.readers == 0:
            lease.readers = 0

    def notified(self, request_id: str, reader: tuple[int, int], readers: int) -> None:
        """A reader is done (a note for a request not held yet is kept: it may come first)."""
        if request_id in self.released:
            return
        lease = self.held.setdefault(request_id, Lease(float("inf")))
        lease.readers = readers
        lease.seen.add(reader)

    def due(self, now: float) -> tuple[set[str], set[str]]:
        """(read by every reader, expired unread), each dropped from the leases."""
        read = {request for request, lease in self.held.items()
                if lease.readers is not None and len(lease.seen) >= lease.readers}
        expired = {request for request, lease in self.held.items()
                   if request not in read and lease.expires_at <= now}
        for request in read | expired:
            del self.held[request]
        self.released |= read | expired
        return read, expired


class Agent:
    """One worker's NIXL agent over UCX, its regions registered once (nixl-cu12 1.5.1)."""

    def __init__(self, name: str, regions: Sequence[Region]) -> None:
        api = importlib.import_module("nixl_cu12._api")  # optional: never a dependency
        self.name = name
        self.agent: Any = api.nixl_agent(name, api.nixl_agent_config(
            enable_prog_thread=True, backends=["UCX"]))
        for mem_type in ("DRAM", "VRAM"):
            mine = [(r.base, r.size, r.device, "") for r in regions if r.mem_type == mem_type]
            if mine:
                self.agent.register_memory(mine, mem_type)
        self.peers: dict[str, str] = {}

    @property
    def metadata(self) -> bytes:
        data: bytes = self.agent.get_agent_metadata()
        return data

    def peer(self, payload: HandshakePayload) -> str:
        """The remote agent's name, added once."""
        known = self.peers.get(payload.agent_name)
        if known is None:
            known = self.peers[payload.agent_name] = self.agent.add_remote_agent(
                payload.metadata_bytes)
        return known

    def notes(self) -> list[tuple[str, tuple[int, int], int]]:
        found = []
        for messages in self.agent.get_new_notifs().values():
            for note in messages:
                parsed = parse_notification(bytes(note))
                if parsed is not None:
                    found.append(parsed)
        return found

    def notify(self, payload: HandshakePayload, message: bytes) -> None:
        self.agent.send_notif(self.peer(payload), message)
