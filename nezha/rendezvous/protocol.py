"""Wire format of the rendezvous store, shared by the server and the client.

Every message is a frame: a 4-byte big-endian length, then that many payload bytes. Frames larger
than ``MAX_FRAME_BYTES`` are refused before anything is allocated, so a stray or hostile peer cannot
make the server reserve a huge buffer.

Handshake (mutual HMAC-SHA256 challenge-response; the secret never crosses the wire):

1. server -> client: ``MAGIC`` + 32-byte server nonce
2. client -> server: 32-byte client nonce + HMAC(secret, b"client" + server nonce + client nonce)
3. server -> client: ``STATUS_OK`` + HMAC(secret, b"server" + server nonce + client nonce), or
   ``STATUS_ERROR`` + reason, after which the server closes the connection.

Requests are ``op (1 byte) + body``; replies are ``status (1 byte) + body``. Strings are UTF-8 with
a 2-byte length prefix. Counters created by ``ADD`` are stored as ASCII decimal, so ``GET`` on a
counter returns e.g. ``b"3"`` (as c10d's TCPStore does).

    SET    key, value (rest of the frame)           -> OK
    GET    timeout_ms (u32), key                    -> OK + value | TIMEOUT
    WAIT   timeout_ms (u32), count (u16), keys...   -> OK | TIMEOUT + count (u16) + missing keys...
    ADD    delta (i64), key                         -> OK + new value (i64)
    CHECK  count (u16), keys...                     -> OK + all present (u8)
    DELETE key                                      -> OK + existed (u8)
    MGET   timeout_ms (u32), count (u16), keys...   -> OK + (u32 length + value) per key
                                                       | TIMEOUT + count (u16) + missing keys...

MGET is how every rank reads all ranks' addresses in one round trip: n ranks cost the server n
requests, not n^2.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
from typing import List, Sequence, Tuple

MAGIC = b"NZRV1"
NONCE_BYTES = 32
DIGEST_BYTES = hashlib.sha256().digest_size
MAX_FRAME_BYTES = 16 * 1024 * 1024
MAX_KEY_BYTES = 0xFFFF
MAX_TIMEOUT_MS = 0xFFFFFFFF

OP_SET = 1
OP_GET = 2
OP_WAIT = 3
OP_ADD = 4
OP_CHECK = 5
OP_DELETE = 6
OP_MGET = 7

STATUS_OK = 0
STATUS_TIMEOUT = 1
STATUS_ERROR = 2

_CLIENT_TAG = b"nezha-rendezvous-client"
_SERVER_TAG = b"nezha-rendezvous-server"
_LEN = struct.Struct(">I")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


class ProtocolError(Exception):
    """The peer sent something that does not follow this protocol."""


# --- framing -------------------------------------------------------------------------------------

def send_frame(sock: socket.socket, payload: bytes) -> None:
    """Send one length-prefixed frame."""
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"rendezvous message of {len(payload)} bytes exceeds the "
                         f"{MAX_FRAME_BYTES}-byte limit")
    sock.sendall(_LEN.pack(len(payload)) + payload)


def recv_frame(sock: socket.socket) -> bytes:
    """Receive one frame. Raises EOFError on a clean close, ProtocolError on an oversized frame."""
    (length,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {length} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return _recv_exact(sock, length)


def _recv_exact(sock: socket.socket, count: int) -> bytes:
    chunks = []
    remaining = count
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("connection closed by peer")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


# --- authentication ------------------------------------------------------------------------------

def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the client sends to prove it knows the secret."""
    return hmac.new(secret, _CLIENT_TAG + server_nonce + client_nonce, hashlib.sha256).digest()


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the server sends back to prove it knows the secret too."""
    return hmac.new(secret, _SERVER_TAG + server_nonce + client_nonce, hashlib.sha256).digest()


# --- body encoding -------------------------------------------------------------------------------

def encode_key(key: str) -> bytes:
    """A key as u16 length + UTF-8 bytes."""
    raw = key.encode("utf-8")
    if not raw:
        raise ValueError("rendezvous key must not be empty")
    if len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"rendezvous key of {len(raw)} bytes exceeds {MAX_KEY_BYTES} bytes")
    return _U16.pack(len(raw)) + raw


def encode_keys(keys: Sequence[str]) -> bytes:
    """A key list as u16 count + keys."""
    if len(keys) > 0xFFFF:
        raise ValueError(f"cannot send {len(keys)} keys in one request (max 65535)")
    return _U16.pack(len(keys)) + b"".join(encode_key(k) for k in keys)


def encode_timeout_ms(timeout_s: float) -> bytes:
    """A timeout in seconds as u32 milliseconds (clamped to the representable range)."""
    return _U32.pack(max(0, min(MAX_TIMEOUT_MS, int(timeout_s * 1000))))


def encode_i64(value: int) -> bytes:
    """A signed 64-bit integer."""
    return _I64.pack(value)


def encode_values(values: Sequence[bytes]) -> bytes:
    """Values as (u32 length + bytes) each; the count is the request's."""
    return b"".join(_U32.pack(len(v)) + bytes(v) for v in values)


def encode_value_list(values: Sequence[bytes]) -> bytes:
    """A count (u32), then the values as encode_values writes them: a list that carries its own
    length (Reader.value_list reads it)."""
    return _U32.pack(len(values)) + encode_values(values)


def encode_bool(value: bool) -> bytes:
    """A boolean as one byte."""
    return b"\x01" if value else b"\x00"


class Reader:
    """Decodes a message body field by field; any short or invalid field raises ProtocolError."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def _take(self, count: int) -> bytes:
        end = self._pos + count
        if end > len(self._data):
            raise ProtocolError("message truncated")
        chunk = self._data[self._pos:end]
        self._pos = end
        return chunk

    def u8(self) -> int:
        return self._take(1)[0]

    def u16(self) -> int:
        return _U16.unpack(self._take(2))[0]

    def u32(self) -> int:
        return _U32.unpack(self._take(4))[0]

    def i64(self) -> int:
        return _I64.unpack(self._take(8))[0]

    def key(self) -> str:
        raw = self._take(self.u16())
        if not raw:
            raise ProtocolError("empty key")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError("key is not valid UTF-8") from exc

    def keys(self) -> List[str]:
        return [self.key() for _ in range(self.u16())]

    def values(self, count: int) -> List[bytes]:
        # One pass without a method call per field: every rank reads n values twice at start-up
        # (the store's MGET reply, then each rank's address list).
        data, pos, out = self._data, self._pos, []
        for _ in range(count):
            if pos + _U32.size > len(data):
                raise ProtocolError("message truncated")
            (length,) = _U32.unpack_from(data, pos)
            pos += _U32.size
            if pos + length > len(data):
                raise ProtocolError("message truncated")
            out.append(data[pos:pos + length])
            pos += length
        self._pos = pos
        return out

    def value_list(self) -> List[bytes]:
        return self.values(self.u32())

    def rest(self) -> bytes:
        chunk = self._data[self._pos:]
        self._pos = len(self._data)
        return chunk

    def end(self) -> None:
        """Asserts the whole message was consumed."""
        if self._pos != len(self._data):
            raise ProtocolError(f"{len(self._data) - self._pos} unexpected trailing bytes")


def split_status(reply: bytes) -> Tuple[int, Reader]:
    """Splits a reply into its status byte and a reader over the body."""
    if not reply:
        raise ProtocolError("empty reply")
    return reply[0], Reader(reply[1:])
