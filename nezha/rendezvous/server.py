"""The rendezvous store server: an authenticated key-value store over TCP.

One thread per connection (connections are few: one per rank, held for the job's lifetime). A
connection must pass the HMAC handshake within ``HANDSHAKE_TIMEOUT_S``; anything unauthenticated
or malformed is logged at warning level and dropped, and the other connections are unaffected.
Blocking reads (GET, WAIT, MGET) wait with a deadline, never by polling, each on a Condition of
the one key it still misses: a write wakes only that key's waiters, so n ranks each waiting for
all n addresses cost O(n) wake-ups per rank instead of one per write per waiter.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import socketserver
import threading
import time
from typing import Dict, Iterable, List, Optional, Set, Tuple

from nezha.rendezvous import protocol as p

log = logging.getLogger("nezha.rendezvous")

# How long a new connection may take to authenticate. Generous for loaded machines, short enough
# that half-open or silent connections do not pile up.
HANDSHAKE_TIMEOUT_S = 10.0


class _KeyValueTable:
    """The store's data: a dict, one lock, and a Condition per key that someone waits for."""

    def __init__(self) -> None:
        self._values: Dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._awaited: Dict[str, threading.Condition] = {}
        self._closed = False

    def _written(self, key: str) -> None:
        waiters = self._awaited.pop(key, None)
        if waiters is not None:
            waiters.notify_all()

    def set(self, key: str, value: bytes) -> None:
        with self._lock:
            self._values[key] = value
            self._written(key)

    def add(self, key: str, delta: int) -> int:
        with self._lock:
            current = self._values.get(key, b"0")
            try:
                total = int(current.decode("ascii")) + delta
            except (UnicodeDecodeError, ValueError):
                raise ValueError(f"key '{key}' holds a non-integer value; cannot add to it")
            self._values[key] = str(total).encode("ascii")
            self._written(key)
            return total

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._values.pop(key, None) is not None

    def contains_all(self, keys: Iterable[str]) -> bool:
        with self._lock:
            return all(k in self._values for k in keys)

    def peek(self, key: str) -> Optional[bytes]:
        with self._lock:
            return self._values.get(key)

    def keys(self) -> List[str]:
        with self._lock:
            return list(self._values)

    def wait_for(self, keys: List[str], timeout_s: float) -> List[str]:
        """Blocks until every key exists or the timeout passes; returns the keys still missing."""
        with self._lock:
            return self._wait_held(keys, timeout_s)

    def get_all(self, keys: List[str], timeout_s: float) -> Tuple[Optional[List[bytes]], List[str]]:
        """(values in order, []) once every key exists, or (None, missing keys) at the timeout."""
        with self._lock:
            missing = self._wait_held(keys, timeout_s)
            return (None, missing) if missing else ([self._values[k] for k in keys], [])

    def _wait_held(self, keys: List[str], timeout_s: float) -> List[str]:
        deadline = time.monotonic() + timeout_s
        first_missing = 0  # the keys before it were present when last looked at
        while True:
            while first_missing < len(keys) and keys[first_missing] in self._values:
                first_missing += 1
            if first_missing == len(keys):
                # A key may have been deleted since it was passed: look once more, whole.
                gone = [i for i, k in enumerate(keys) if k not in self._values]
                if not gone:
                    return []
                first_missing = gone[0]
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                return [k for k in keys if k not in self._values]
            key = keys[first_missing]
            waiters = self._awaited.get(key)
            if waiters is None:
                waiters = self._awaited[key] = threading.Condition(self._lock)
            waiters.wait(remaining)

    def close(self) -> None:
        """Wakes every waiter so that server shutdown never waits on a blocked GET."""
        with self._lock:
            self._closed = True
            for waiters in self._awaited.values():
                waiters.notify_all()
            self._awaited.clear()


class _ConnectionHandler(socketserver.BaseRequestHandler):
    server: "_ThreadingServer"

    def handle(self) -> None:
        sock: socket.socket = self.request
        peer = "%s:%s" % self.client_address[:2]
        self.server.track(sock)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            if not self._authenticate(sock, peer):
                return
            sock.settimeout(None)  # authenticated ranks may stay idle for the whole job
            self._serve_requests(sock, peer)
        except (p.ProtocolError, ValueError) as exc:
            log.warning("rendezvous: dropping connection from %s: malformed message (%s)",
                        peer, exc)
        except socket.timeout:
            log.warning("rendezvous: dropping connection from %s: no handshake within %.0f s",
                        peer, HANDSHAKE_TIMEOUT_S)
        except EOFError:
            pass  # the client went away; normal at the end of a job
        except OSError as exc:
            if not self.server.stopping:
                log.warning("rendezvous: connection from %s failed: %s", peer, exc)
        finally:
            self.server.untrack(sock)

    def _authenticate(self, sock: socket.socket, peer: str) -> bool:
        server_nonce = secrets.token_bytes(p.NONCE_BYTES)
        p.send_frame(sock, p.MAGIC + server_nonce)
        answer = p.recv_frame(sock)
        if len(answer) != p.NONCE_BYTES + p.DIGEST_BYTES:
            raise p.ProtocolError(f"handshake answer of {len(answer)} bytes")
        client_nonce, proof = answer[:p.NONCE_BYTES], answer[p.NONCE_BYTES:]
        secret = self.server.secret
        if not hmac.compare_digest(proof, p.client_proof(secret, server_nonce, client_nonce)):
            log.warning("rendezvous: rejected connection from %s: authentication failed "
                        "(wrong secret)", peer)
            p.send_frame(sock, bytes([p.STATUS_ERROR]) + b"authentication failed")
            return False
        proof = p.server_proof(secret, server_nonce, client_nonce)
        p.send_frame(sock, bytes([p.STATUS_OK]) + proof)
        return True

    def _serve_requests(self, sock: socket.socket, peer: str) -> None:
        while not self.server.stopping:
            request = p.recv_frame(sock)
            p.send_frame(sock, self._execute(request, peer))

    def _execute(self, request: bytes, peer: str) -> bytes:
        if not request:
            raise p.ProtocolError("empty request")
        op, body = request[0], p.Reader(request[1:])
        table = self.server.table
        ok = bytes([p.STATUS_OK])
        if op == p.OP_SET:
            key = body.key()
            table.set(key, body.rest())
            return ok
        if op == p.OP_GET:
            timeout_s = body.u32() / 1000.0
            key = body.key()
            body.end()
            if table.wait_for([key], timeout_s):
                return bytes([p.STATUS_TIMEOUT])
            value = table.peek(key)
            return ok + (value if value is not None else b"")
        if op == p.OP_WAIT:
            timeout_s = body.u32() / 1000.0
            keys = body.keys()
            body.end()
            missing = table.wait_for(keys, timeout_s)
            return ok if not missing else bytes([p.STATUS_TIMEOUT]) + p.encode_keys(missing)
        if op == p.OP_MGET:
            timeout_s = body.u32() / 1000.0
            keys = body.keys()
            body.end()
            values, missing = table.get_all(keys, timeout_s)
            if values is None:
                return bytes([p.STATUS_TIMEOUT]) + p.encode_keys(missing)
            return ok + p.encode_values(values)
        if op == p.OP_ADD:
            delta = body.i64()
            key = body.key()
            body.end()
            try:
                return ok + p.encode_i64(table.add(key, delta))
            except ValueError as exc:  # a client error, not a protocol violation: keep serving
                return bytes([p.STATUS_ERROR]) + str(exc).encode("utf-8")
        if op == p.OP_CHECK:
            keys = body.keys()
            body.end()
            return ok + p.encode_bool(table.contains_all(keys))
        if op == p.OP_DELETE:
            key = body.key()
            body.end()
            return ok + p.encode_bool(table.delete(key))
        raise p.ProtocolError(f"unknown operation {op}")


class _ThreadingServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # every rank connects at once at startup

    def __init__(self, address, secret: bytes) -> None:
        super().__init__(address, _ConnectionHandler)
        self.secret = secret
        self.table = _KeyValueTable()
        self.stopping = False
        self._open: Set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def track(self, sock: socket.socket) -> None:
        with self._open_lock:
            self._open.add(sock)

    def untrack(self, sock: socket.socket) -> None:
        with self._open_lock:
            self._open.discard(sock)

    def close_connections(self) -> None:
        with self._open_lock:
            for sock in self._open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class StoreServer:
    """Serves the rendezvous key-value store on ``host:port`` (port 0 picks a free port).

    Use ``start()`` to serve from a background thread and ``stop()`` to close every connection.
    ``port`` is the bound port once constructed. The ``peek``/``keys`` methods read the table
    in-process (nezharun uses them to see which ranks have arrived).
    """

    def __init__(self, host: str, port: int = 0, secret: bytes = b"") -> None:
        if not isinstance(secret, (bytes, bytearray)):
            raise TypeError("secret must be bytes")
        try:
            self._server = _ThreadingServer((host, port), bytes(secret))
        except OSError as exc:
            raise OSError(exc.errno, f"rendezvous store cannot listen on {host}:{port}: "
                                     f"{exc.strerror}") from exc
        self._thread: Optional[threading.Thread] = None

    @property
    def host(self) -> str:
        """The address the server is bound to."""
        return self._server.server_address[0]

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        return self._server.server_address[1]

    def start(self) -> "StoreServer":
        """Starts serving from a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever,
                                            kwargs={"poll_interval": 0.2},
                                            name=f"nezha-rendezvous-{self.port}", daemon=True)
            self._thread.start()
            log.info("rendezvous store listening on %s:%d", self.host, self.port)
        return self

    def stop(self) -> None:
        """Stops accepting, wakes blocked waiters and closes every open connection."""
        self._server.stopping = True
        self._server.table.close()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.close_connections()
        self._server.server_close()

    def peek(self, key: str) -> Optional[bytes]:
        """The value of ``key`` in this process's table, or None (no network, no waiting)."""
        return self._server.table.peek(key)

    def keys(self) -> List[str]:
        """Every key currently stored."""
        return self._server.table.keys()

    def __enter__(self) -> "StoreServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
