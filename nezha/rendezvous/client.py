"""The rendezvous store client.

Ranks usually start before (or at the same moment as) the process that serves the store, so
connecting retries with a capped exponential backoff until the client's timeout. One TCP
connection per client; a lock serialises requests so a client may be shared between threads.
"""

from __future__ import annotations

import hmac
import secrets
import socket
import threading
import time
from typing import List, Optional, Sequence

from nezha.rendezvous import protocol as p

# Extra time the client's socket waits beyond a server-side wait, so that the server's TIMEOUT
# reply (which names the key) arrives before the socket gives up.
_REPLY_SLACK_S = 5.0
_RETRY_INITIAL_S = 0.05
_RETRY_MAX_S = 1.0


class StoreClient:
    """A connection to a rendezvous ``StoreServer``.

    ``timeout_s`` bounds connecting (with retries) and is the default for ``get`` and ``wait``.
    Raises ``TimeoutError`` if the store cannot be reached in time and ``PermissionError`` if the
    handshake fails (the two sides hold different secrets).
    """

    def __init__(self, host: str, port: int, secret: bytes, timeout_s: float = 30.0) -> None:
        if not isinstance(secret, (bytes, bytearray)):
            raise TypeError("secret must be bytes")
        self._host = host
        self._port = int(port)
        self._secret = bytes(secret)
        self._timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = self._connect(time.monotonic() + self._timeout_s)

    @property
    def address(self) -> str:
        """``host:port`` of the store, for messages."""
        return f"{self._host}:{self._port}"

    # --- public operations -----------------------------------------------------------------------

    def set(self, key: str, value: bytes) -> None:
        """Stores ``value`` under ``key`` (replacing any previous value) and wakes its waiters."""
        self._request(bytes([p.OP_SET]) + p.encode_key(key) + bytes(value), self._timeout_s)

    def get(self, key: str, timeout_s: Optional[float] = None) -> bytes:
        """Returns the value of ``key``, waiting until it is set; ``TimeoutError`` names the key."""
        wait_s = self._timeout_s if timeout_s is None else float(timeout_s)
        status, body = self._request(
            bytes([p.OP_GET]) + p.encode_timeout_ms(wait_s) + p.encode_key(key),
            wait_s + _REPLY_SLACK_S)
        if status == p.STATUS_TIMEOUT:
            raise TimeoutError(f"rendezvous key '{key}' was not set within {wait_s:g} s "
                               f"(store {self.address})")
        return body.rest()

    def get_many(self, keys: Sequence[str], timeout_s: Optional[float] = None) -> List[bytes]:
        """The values of ``keys`` in order, in one round trip, waiting until all are set;
        ``TimeoutError`` lists the missing keys."""
        keys = list(keys)
        body = self._wait_for_keys(p.OP_MGET, keys, timeout_s)
        values = body.values(len(keys))
        body.end()
        return values

    def wait(self, keys: Sequence[str], timeout_s: Optional[float] = None) -> None:
        """Waits until every key in ``keys`` is set; ``TimeoutError`` lists the missing keys."""
        self._wait_for_keys(p.OP_WAIT, list(keys), timeout_s)

    def _wait_for_keys(self, op: int, keys: List[str], timeout_s: Optional[float]) -> p.Reader:
        """Sends a request that the server answers once every key exists (WAIT, MGET); returns the
        reply's body, or raises ``TimeoutError`` listing the keys still missing."""
        wait_s = self._timeout_s if timeout_s is None else float(timeout_s)
        status, body = self._request(
            bytes([op]) + p.encode_timeout_ms(wait_s) + p.encode_keys(keys), wait_s + _REPLY_SLACK_S)
        if status == p.STATUS_TIMEOUT:
            missing = body.keys()
            shown = ", ".join(f"'{k}'" for k in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise TimeoutError(f"rendezvous keys {shown}{more} were not set within {wait_s:g} s "
                               f"(store {self.address})")
        return body

    def add(self, key: str, delta: int) -> int:
        """Atomically adds ``delta`` to the counter ``key`` (0 if unset); returns the new value."""
        _, body = self._request(bytes([p.OP_ADD]) + p.encode_i64(int(delta)) + p.encode_key(key),
                                self._timeout_s)
        return body.i64()

    def check(self, keys: Sequence[str]) -> bool:
        """True if every key in ``keys`` is set, without waiting."""
        _, body = self._request(bytes([p.OP_CHECK]) + p.encode_keys(list(keys)), self._timeout_s)
        return bool(body.u8())

    def delete(self, key: str) -> bool:
        """Removes ``key``; returns whether it existed."""
        _, body = self._request(bytes([p.OP_DELETE]) + p.encode_key(key), self._timeout_s)
        return bool(body.u8())

    def close(self) -> None:
        """Closes the connection. Further calls raise ``ConnectionError``."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def __enter__(self) -> "StoreClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # --- internals -------------------------------------------------------------------------------

    def _connect(self, deadline: float) -> socket.socket:
        delay = _RETRY_INITIAL_S
        last_error: Optional[BaseException] = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"could not reach the rendezvous store at {self.address} within "
                                   f"{self._timeout_s:g} s: {last_error}")
            try:
                sock = socket.create_connection((self._host, self._port), timeout=remaining)
            except OSError as exc:  # refused, unreachable, unresolvable: the server may be late
                last_error = exc
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, _RETRY_MAX_S)
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                self._handshake(sock)
            except BaseException:
                sock.close()
                raise
            return sock

    def _handshake(self, sock: socket.socket) -> None:
        try:
            greeting = p.recv_frame(sock)
            if len(greeting) != len(p.MAGIC) + p.NONCE_BYTES or not greeting.startswith(p.MAGIC):
                raise ConnectionError(f"{self.address} is not a Nezha rendezvous store")
            server_nonce = greeting[len(p.MAGIC):]
            client_nonce = secrets.token_bytes(p.NONCE_BYTES)
            p.send_frame(sock, client_nonce + p.client_proof(self._secret, server_nonce,
                                                             client_nonce))
            status, body = p.split_status(p.recv_frame(sock))
        except socket.timeout:
            raise TimeoutError(f"rendezvous store at {self.address} did not complete the "
                               f"handshake in time") from None
        except (EOFError, p.ProtocolError) as exc:
            raise ConnectionError(f"rendezvous store at {self.address} broke off the handshake: "
                                  f"{exc}") from None
        if status != p.STATUS_OK:
            raise PermissionError(f"rendezvous store at {self.address} rejected this process: "
                                  f"{body.rest().decode('utf-8', 'replace')} (is NEZHA_SECRET the "
                                  f"same on every rank?)")
        expected = p.server_proof(self._secret, server_nonce, client_nonce)
        if not hmac.compare_digest(body.rest(), expected):
            raise PermissionError(f"the server at {self.address} failed to prove it knows the job "
                                  f"secret; refusing to use it as the rendezvous store")

    def _request(self, request: bytes, socket_timeout_s: float):
        with self._lock:
            if self._sock is None:
                raise ConnectionError(f"rendezvous client for {self.address} is closed")
            try:
                self._sock.settimeout(socket_timeout_s)
                p.send_frame(self._sock, request)
                status, body = p.split_status(p.recv_frame(self._sock))
            except socket.timeout:
                # The reply may still arrive later and would be read as the next request's answer.
                self._drop_connection()
                raise TimeoutError(f"rendezvous store at {self.address} did not answer within "
                                   f"{socket_timeout_s:g} s") from None
            except (EOFError, OSError, p.ProtocolError) as exc:
                self._drop_connection()
                raise ConnectionError(f"lost the connection to the rendezvous store at "
                                      f"{self.address}: {exc}") from None
        if status == p.STATUS_ERROR:
            raise ValueError(f"rendezvous store at {self.address}: "
                             f"{body.rest().decode('utf-8', 'replace')}")
        return status, body

    def _drop_connection(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
