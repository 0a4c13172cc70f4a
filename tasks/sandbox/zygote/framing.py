"""Framing of the sandbox's stream sockets: a 4-byte big-endian header length, a JSON header,
then ``header["size"]`` payload bytes.

Part of the zygote program (see :mod:`tasks.sandbox.zygote`); also imported by the harness side
(:mod:`tasks.sandbox.session_client`, :mod:`tasks.sandbox.pool`), which speaks the same framing.
"""

from __future__ import annotations

import json
import socket
import struct
import time

_LEN = struct.Struct(">I")
MAX_HEADER_BYTES = 1 << 20


def send_msg(sock: socket.socket, header: dict, payload: bytes = b"") -> None:
    """Send one message (``header`` as JSON, then ``payload``) on a stream socket."""
    header = {k: v for k, v in header.items() if k != "size"}
    if payload:
        header["size"] = len(payload)
    data = json.dumps(header).encode()
    sock.sendall(_LEN.pack(len(data)) + data)
    if payload:
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the sandbox did not answer in time")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        if k == 0:
            return None
        got += k
    return bytes(buf)


def recv_msg(sock: socket.socket, deadline: float | None = None,
             max_payload: int = 1 << 40) -> tuple[dict | None, bytes]:
    """Receive one message: ``(header, payload)``; ``(None, b"")`` at end of stream.

    Raises TimeoutError past ``deadline`` (a ``time.monotonic()`` instant), ValueError for a
    header over 1 MiB or a payload over ``max_payload`` bytes.
    """
    raw = _recv_exact(sock, _LEN.size, deadline)
    if raw is None:
        return None, b""
    (n,) = _LEN.unpack(raw)
    if n > MAX_HEADER_BYTES:
        raise ValueError(f"sandbox message header of {n} bytes")
    body = _recv_exact(sock, n, deadline)
    if body is None:
        return None, b""
    header = json.loads(body)
    size = int(header.get("size", 0))
    if size > max_payload:
        raise ValueError(f"sandbox message payload of {size} bytes (at most {max_payload})")
    payload = _recv_exact(sock, size, deadline) if size else b""
    if size and payload is None:
        return None, b""
    return header, payload or b""
