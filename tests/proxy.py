"""A TCP proxy on 127.0.0.1 that tests can cut or stall, to make a database unreachable.

Connections go client → proxy → target. ``cut()`` drops every open connection and refuses new
ones (they are closed at once); ``stall()`` keeps connections open but stops moving bytes (a
silent network); ``restore()`` lets traffic through again. Bounded: every thread stops when the
proxy is closed.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Iterator

__all__ = ["Proxy", "proxied"]


class Proxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._mode = "pass"
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = threading.Event()
        self._moving = threading.Event()
        self._moving.set()
        self._thread = threading.Thread(target=self._accept, name="test-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                refused = self._mode == "cut"
            if refused:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(
                target=self._pump, args=(client, upstream), name="test-proxy-pump", daemon=True
            ).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peers = {client: upstream, upstream: client}
        with selectors.DefaultSelector() as selector:
            try:
                # Inside the try: cut() may close the pair before this thread got here.
                for sock in peers:
                    sock.setblocking(False)
                    selector.register(sock, selectors.EVENT_READ)
                while not self._closed.is_set():
                    if not self._moving.wait(0.2):
                        continue
                    for key, _ in selector.select(0.2):
                        if not self._moving.is_set():
                            break
                        source = key.fileobj
                        assert isinstance(source, socket.socket)
                        data = source.recv(65536)
                        if not data:
                            return
                        peers[source].setblocking(True)
                        peers[source].sendall(data)
                        peers[source].setblocking(False)
            except (OSError, ValueError):  # closed under us (ValueError: a closed fd)
                return
            finally:
                for sock in peers:
                    with contextlib.suppress(OSError):
                        sock.close()

    def cut(self) -> None:
        """Drop every connection and refuse new ones."""
        with self._lock:
            self._mode = "cut"
            pairs, self._pairs = self._pairs, []
        self._moving.set()
        for client, upstream in pairs:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def stall(self) -> None:
        """Keep connections open but move no bytes (a silent network)."""
        self._moving.clear()

    def restore(self) -> None:
        """Let traffic through again."""
        with self._lock:
            self._mode = "pass"
        self._moving.set()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._thread.join(5)


@contextlib.contextmanager
def proxied(host: str, port: int) -> Iterator[Proxy]:
    proxy = Proxy(host, port)
    try:
        yield proxy
    finally:
        proxy.close()
