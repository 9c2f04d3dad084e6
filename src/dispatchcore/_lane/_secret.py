"""The driver's lane secret, and the mutual challenge-response every lane link runs before a byte is unpickled.

One secret per driver process: every group it starts, and every link between
its groups (weight sync, rows handed between groups), proves the same key.
Ranks never read it from a store: the executor hands it over the way it
starts them (a child's pipe, a Ray actor's creation).  The handshake is
multiprocessing's authkey challenge made mutual and bound to its direction:
each side sends a fresh nonce and checks an HMAC of it, so neither a fake
rank nor a fake driver gets past it, and a recorded answer is worthless.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import threading

from .._base import DispatchRuntimeError, DispatchValueError

#: Bytes of a secret made by :func:`lane_secret`.
SECRET_BYTES = 32
#: How long one side of a handshake may take to answer (a stranger that says nothing is dropped after this).
HANDSHAKE_TIMEOUT_S = 2.0

_MAGIC = b"dispatchcore-lane/1"
_NONCE = 32
_DIGEST = hashlib.sha256().digest_size
_WHO = struct.Struct("<Q")
_lock = threading.Lock()
_secret: bytes | None = None


class LaneAuthError(DispatchRuntimeError):
    """A lane peer could not prove it knows the driver's secret (nothing it sent was unpickled)."""


def lane_secret() -> bytes:
    """This process's lane secret: the one :func:`use_lane_secret` set, else 32 random bytes made once."""
    global _secret
    with _lock:
        if _secret is None:
            _secret = secrets.token_bytes(SECRET_BYTES)
        return _secret


def use_lane_secret(secret: bytes) -> None:
    """Make this process's lanes use ``secret`` (every process of one launch shares it); before any lane opens."""
    global _secret
    secret = check_secret(secret)
    with _lock:
        if _secret is not None and not hmac.compare_digest(_secret, secret):
            raise DispatchRuntimeError(
                "this process already uses another lane secret: call use_lane_secret() before the first "
                "WorkerGroup or lane of this process"
            )
        _secret = secret


def check_secret(secret: object) -> bytes:
    """``secret`` as bytes, refused when it is too short to guard anything."""
    if not isinstance(secret, bytes | bytearray) or len(secret) < 16:
        raise DispatchValueError(
            f"a lane secret is at least 16 bytes (got {type(secret).__name__}"
            f"{f' of {len(secret)} bytes' if isinstance(secret, bytes | bytearray) else ''})"
        )
    return bytes(secret)


def _mac(secret: bytes, role: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"|".join((_MAGIC, role, *parts)), hashlib.sha256).digest()


def _host_port(name: object) -> bytes:
    """A socket end as ``host port`` bytes (an IPv4 peer seen through an IPv6 socket reads as IPv4)."""
    host, port = name[0], name[1]  # type: ignore[index]  # AF_INET and AF_INET6 names both start so
    return f"{str(host).removeprefix('::ffff:')} {port}".encode()


def _ends(sock: socket.socket, listening: bool) -> bytes:
    """Both ends of this TCP connection, the rank's first, as each side sees them.

    Binding the answers to the connection makes a relay useless: a stranger who
    passes one side's challenge on to the other sits on two connections whose
    ends differ, so neither answer checks out.
    """
    mine, theirs = _host_port(sock.getsockname()), _host_port(sock.getpeername())
    return theirs + b"/" + mine if listening else mine + b"/" + theirs


def _read(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise LaneAuthError("the peer closed the connection during the lane handshake")
        data += chunk
    return bytes(data)


def accept_link(sock: socket.socket, secret: bytes, timeout: float = HANDSHAKE_TIMEOUT_S) -> int:
    """The listening side: challenge the peer, check its answer, prove ourselves; the ``who`` it named.

    Raises :class:`LaneAuthError` (the socket is left to the caller to close) when the peer fails.
    """
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        ours, ends = secrets.token_bytes(_NONCE), _ends(sock, listening=True)
        sock.sendall(_MAGIC + ours)
        who_bytes, theirs, answer = _read(sock, _WHO.size), _read(sock, _NONCE), _read(sock, _DIGEST)
        if not hmac.compare_digest(answer, _mac(secret, b"rank", ours, theirs, who_bytes, ends)):
            raise LaneAuthError("a peer answered the lane challenge without the driver's secret")
        sock.sendall(_mac(secret, b"driver", theirs, ours, who_bytes, ends))
        return int(_WHO.unpack(who_bytes)[0])
    except OSError as exc:
        raise LaneAuthError(f"the lane handshake failed: {exc}") from exc
    finally:
        sock.settimeout(previous)


def offer_link(sock: socket.socket, secret: bytes, who: int, timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
    """The connecting side: answer the listener's challenge as ``who``, then check that it knows the secret too."""
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        hello = _read(sock, len(_MAGIC) + _NONCE)
        if not hello.startswith(_MAGIC):
            raise LaneAuthError("the listener is not a dispatchcore lane (no lane greeting)")
        theirs, ours, who_bytes = hello[len(_MAGIC) :], secrets.token_bytes(_NONCE), _WHO.pack(who)
        ends = _ends(sock, listening=False)
        sock.sendall(who_bytes + ours + _mac(secret, b"rank", theirs, ours, who_bytes, ends))
        proof = _read(sock, _DIGEST)
        if not hmac.compare_digest(proof, _mac(secret, b"driver", ours, theirs, who_bytes, ends)):
            raise LaneAuthError("the lane's listener could not prove it knows the driver's secret (a fake driver?)")
    except OSError as exc:
        raise LaneAuthError(f"the lane handshake failed: {exc}") from exc
    finally:
        sock.settimeout(previous)
