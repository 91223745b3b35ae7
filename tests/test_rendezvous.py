"""The rendezvous store: operations, timeouts, authentication and robustness to bad peers."""

import socket
import struct
import threading
import time

import pytest

from nezha.rendezvous import StoreClient, StoreServer
from nezha.rendezvous import protocol

SECRET = bytes.fromhex("5e" * 32)


@pytest.fixture
def server():
    srv = StoreServer("127.0.0.1", 0, SECRET).start()
    yield srv
    srv.stop()


def connect(srv, secret=SECRET, timeout_s=5.0):
    return StoreClient("127.0.0.1", srv.port, secret, timeout_s=timeout_s)


def test_set_then_get_returns_the_bytes(server):
    with connect(server) as client:
        payload = bytes(range(256)) * 10
        client.set("addr/3", payload)
        assert client.get("addr/3") == payload
        client.set("addr/3", b"replaced")
        assert client.get("addr/3") == b"replaced"
        client.set("empty", b"")
        assert client.get("empty") == b""


def test_value_written_by_one_client_is_read_by_another(server):
    with connect(server) as writer, connect(server) as reader:
        writer.set("k", b"v")
        assert reader.get("k") == b"v"
        assert server.peek("k") == b"v"


def test_get_blocks_until_another_client_sets_the_key(server):
    with connect(server) as waiter, connect(server) as setter:
        timer = threading.Timer(0.3, setter.set, args=("late", b"value"))
        started = time.monotonic()
        timer.start()
        try:
            assert waiter.get("late", timeout_s=5) == b"value"
        finally:
            timer.join()
        assert 0.2 < time.monotonic() - started < 4


def test_get_timeout_names_the_key(server):
    with connect(server) as client:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="'never/set'"):
            client.get("never/set", timeout_s=0.3)
        assert time.monotonic() - started < 3
        client.set("after", b"1")  # the connection is still usable after a server-side timeout
        assert client.get("after") == b"1"


def test_wait_returns_when_all_keys_exist_and_lists_missing_ones_on_timeout(server):
    with connect(server) as client, connect(server) as other:
        client.set("a", b"1")
        threading.Timer(0.2, other.set, args=("b", b"2")).start()
        client.wait(["a", "b"], timeout_s=5)
        with pytest.raises(TimeoutError) as info:
            client.wait(["a", "c", "d"], timeout_s=0.2)
        assert "'c'" in str(info.value) and "'d'" in str(info.value)
        assert "'a'" not in str(info.value)


def test_get_many_returns_values_in_order_once_all_writers_have_set(server):
    writers = [connect(server) for _ in range(8)]
    keys = [f"addrs/{i}" for i in range(8)]
    values = [bytes([i]) * (i * 37) for i in range(8)]  # key 0's value is empty
    timers = [threading.Timer(0.05 * (8 - i), w.set, args=(k, v))  # set in reverse order
              for i, (w, k, v) in enumerate(zip(writers, keys, values))]
    try:
        with connect(server) as reader:
            for t in timers:
                t.start()
            assert reader.get_many(keys, timeout_s=5) == values
            assert reader.get_many([keys[3], keys[3], keys[0]]) == [values[3], values[3], values[0]]
    finally:
        for t in timers:
            t.join()
        for w in writers:
            w.close()


def test_get_many_timeout_lists_only_the_missing_keys(server):
    with connect(server) as client:
        client.set("here", b"1")
        client.set("gone", b"2")
        client.delete("gone")
        with pytest.raises(TimeoutError) as info:
            client.get_many(["here", "gone", "never"], timeout_s=0.2)
        text = str(info.value)
        assert "'gone'" in text and "'never'" in text and "'here'" not in text
        assert client.get_many(["here"]) == [b"1"]  # the connection is still usable


def test_many_waiters_are_each_woken_by_their_own_keys(server):
    """Each of 16 readers waits for all 16 keys while 16 writers set them concurrently."""
    n = 16
    keys = [f"k/{i}" for i in range(n)]
    clients = [connect(server) for _ in range(n)]
    results, errors = [None] * n, []

    def rank(i):
        try:
            clients[i].set(keys[i], str(i).encode())
            results[i] = clients[i].get_many(keys, timeout_s=10)
        except Exception as exc:  # reported below, on the test's thread
            errors.append(exc)
    threads = [threading.Thread(target=rank, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    for c in clients:
        c.close()
    assert not errors
    assert results == [[str(i).encode() for i in range(n)]] * n


def test_check_and_delete(server):
    with connect(server) as client:
        assert not client.check(["x"])
        client.set("x", b"")
        assert client.check(["x"])
        assert client.delete("x") is True
        assert client.delete("x") is False
        assert not client.check(["x"])


def test_add_is_atomic_across_concurrent_clients(server):
    clients = [connect(server) for _ in range(4)]
    results = []
    lock = threading.Lock()

    def bump(c):
        for _ in range(50):
            value = c.add("counter", 1)
            with lock:
                results.append(value)

    threads = [threading.Thread(target=bump, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == list(range(1, 201))  # every intermediate value seen exactly once
    assert clients[0].add("counter", -200) == 0
    assert clients[0].get("counter") == b"0"
    for c in clients:
        c.close()


def test_add_on_a_non_integer_value_is_an_error_not_a_disconnect(server):
    with connect(server) as client:
        client.set("text", b"hello")
        with pytest.raises(ValueError, match="non-integer"):
            client.add("text", 1)
        assert client.add("n", 5) == 5


def test_wrong_secret_is_rejected_while_a_good_client_keeps_working(server):
    with connect(server) as good:
        good.set("k", b"v")
        with pytest.raises(PermissionError, match="NEZHA_SECRET"):
            connect(server, secret=b"not the secret")
        assert good.get("k") == b"v"
        good.set("k2", b"v2")
        assert good.get("k2") == b"v2"


def test_client_refuses_a_server_that_does_not_know_the_secret():
    with StoreServer("127.0.0.1", 0, b"other secret").start() as impostor:
        with pytest.raises(PermissionError):
            StoreClient("127.0.0.1", impostor.port, SECRET, timeout_s=5)


def _raw_connection(srv):
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    greeting = protocol.recv_frame(sock)
    assert greeting.startswith(protocol.MAGIC)
    return sock


def _closed_by_server(sock):
    sock.settimeout(5)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_garbage_and_silent_connections_do_not_block_other_clients(server, caplog):
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    huge = _raw_connection(server)
    huge.sendall(struct.pack(">I", 0xFFFFFFF0) + b"junk")  # claims a 4 GiB frame
    garbage = _raw_connection(server)
    garbage.sendall(struct.pack(">I", 7) + b"garbage")  # wrong handshake length
    try:
        with connect(server) as good:
            good.set("still", b"works")
            assert good.get("still") == b"works"
        assert _closed_by_server(huge)
        assert _closed_by_server(garbage)
    finally:
        for s in (silent, huge, garbage):
            s.close()
    assert any("malformed" in r.getMessage() for r in caplog.records)


def test_malformed_request_after_authentication_drops_only_that_connection(server):
    with connect(server) as good, connect(server) as bad:
        protocol.send_frame(bad._sock, bytes([250]) + b"??")  # unknown op after a real handshake
        assert _closed_by_server(bad._sock)
        good.set("a", b"b")
        assert good.get("a") == b"b"


def test_client_retries_until_the_server_starts():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    holder = {}

    def start_later():
        time.sleep(0.5)
        holder["server"] = StoreServer("127.0.0.1", port, SECRET).start()

    t = threading.Thread(target=start_later)
    t.start()
    try:
        with StoreClient("127.0.0.1", port, SECRET, timeout_s=10) as client:
            client.set("k", b"v")
            assert client.get("k") == b"v"
    finally:
        t.join()
        holder["server"].stop()


def test_client_gives_up_when_no_server_appears():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{port}"):
        StoreClient("127.0.0.1", port, SECRET, timeout_s=0.5)
    assert time.monotonic() - started < 3


def test_stop_releases_a_client_blocked_in_get():
    srv = StoreServer("127.0.0.1", 0, SECRET).start()
    client = connect(srv)
    errors = []

    def blocked_get():
        try:
            client.get("never", timeout_s=30)
        except (TimeoutError, ConnectionError) as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked_get)
    t.start()
    time.sleep(0.2)
    started = time.monotonic()
    srv.stop()
    t.join(timeout=10)
    assert not t.is_alive()
    assert time.monotonic() - started < 5
    assert errors
    client.close()


def test_keys_too_long_or_empty_are_rejected_locally(server):
    with connect(server) as client:
        with pytest.raises(ValueError):
            client.set("", b"x")
        with pytest.raises(ValueError):
            client.set("k" * 70000, b"x")
        with pytest.raises(ValueError, match="limit"):
            client.set("big", b"\0" * (protocol.MAX_FRAME_BYTES + 1))


def test_join_as_a_single_process_hosts_the_store_and_announces_arrival():
    from nezha.environ import detect
    from nezha.rendezvous.bootstrap import join
    from nezha.rendezvous.keys import arrival_key, rank_from_arrival_key

    rdzv = join(detect({}), timeout_s=5)
    try:
        assert rdzv.server is not None and rdzv.server.host == "127.0.0.1"
        assert rdzv.server.peek(arrival_key(0)) == b""
        assert rank_from_arrival_key(arrival_key(12)) == 12
        assert rank_from_arrival_key("nezha/arrived/x") is None
        rdzv.client.set("k", b"v")
        assert rdzv.client.get("k") == b"v"
    finally:
        rdzv.close()


def test_join_as_a_worker_connects_to_a_store_served_elsewhere():
    from nezha.environ import detect
    from nezha.rendezvous.bootstrap import join

    with StoreServer("127.0.0.1", 0, SECRET).start() as srv:
        env = {"NEZHA_RANK": "1", "NEZHA_SIZE": "2", "NEZHA_LOCAL_RANK": "1",
               "NEZHA_LOCAL_SIZE": "2", "NEZHA_RENDEZVOUS_ADDR": "127.0.0.1",
               "NEZHA_RENDEZVOUS_PORT": str(srv.port), "NEZHA_SECRET": SECRET.hex()}
        rdzv = join(detect(env), timeout_s=5)
        assert rdzv.server is None
        assert srv.peek("nezha/arrived/1") == b""
        rdzv.close()
