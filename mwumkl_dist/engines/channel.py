"""The superstep channel between the Dask driver and its shards (collective communication).

A superstep must not pay for Dask's task or actor machinery (a round trip of several ms), so the
driver talks to each shard over a socket of its own. That socket honours the cluster's security:

* **TLS** whenever the cluster uses it: the shard wraps its side with the worker's server context
  (``Security.get_listen_args("worker")``), the driver with the client's
  (``Security.get_connection_args("client")``); both verify the cluster's CA. Plaintext only
  when the cluster itself is plaintext.
* **Authentication**: a per-fit secret (32 random bytes the driver hands each shard through Dask)
  and a mutual HMAC-SHA256 challenge/response, each side proving it knows the secret without
  sending it, bound to its role and to both nonces, within :data:`HANDSHAKE_TIMEOUT` seconds.
* **Strangers can neither hang nor break a fit**: the shard listens only on its worker's host,
  accepts in a loop, hands every connection to a handshake thread of its own (bounded by the
  handshake timeout, at most :data:`MAX_PENDING` at a time), closes whoever fails or stays
  silent, keeps waiting for the real driver and stops listening once it has it.

Messages are pickles (the peer is authenticated) in length-prefixed frames; pickle protocol 5
sends numpy arrays out of band, as raw bytes received straight into their final buffer. A frame
is encoded once and may be sent to many peers (:func:`encode` + :meth:`Channel.send_frame`).
"""

from __future__ import annotations

import hashlib
import hmac
import pickle
import queue
import secrets
import socket
import ssl
import struct
import threading

__all__ = ["HANDSHAKE_TIMEOUT", "Channel", "Listener", "connect", "encode", "new_secret"]

#: Seconds a peer has to complete the TLS and HMAC handshakes.
HANDSHAKE_TIMEOUT = 10.0
#: Handshakes in flight at once on one listener; more connections are closed at once.
MAX_PENDING = 64

_MAGIC = b"MWUMKL1\n"
_NONCE = 32
_HEAD = struct.Struct("!IQ")  # number of out-of-band buffers, length of the pickle
_SMALL = 1 << 16  # frames up to this size go out as one send


def new_secret() -> bytes:
    """A fresh per-fit secret."""
    return secrets.token_bytes(32)


def _mac(secret: bytes, role: bytes, *nonces: bytes) -> bytes:
    return hmac.new(secret, role + b"".join(nonces), hashlib.sha256).digest()


def encode(obj) -> list:
    """One frame: header, the pickle (protocol 5) and its out-of-band buffers (large numpy arrays)."""
    raws = []

    def out_of_band(buffer) -> bool:  # a false value: out of band; small buffers stay in the pickle
        raw = buffer.raw()
        if raw.nbytes < _SMALL:
            return True
        raws.append(raw)
        return False

    body = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    if not raws:
        return [_HEAD.pack(0, len(body)) + body]
    head = _HEAD.pack(len(raws), len(body)) + struct.pack(f"!{len(raws)}Q", *(r.nbytes for r in raws))
    return [head + body, *raws]


def _recv_exact(sock, n: int) -> bytearray:
    """Exactly ``n`` bytes (handshakes: nothing is read beyond them)."""
    buf = bytearray(n)
    view = memoryview(buf)
    pos = 0
    while pos < n:
        got = sock.recv_into(view[pos:], n - pos)
        if not got:
            raise EOFError("the peer closed the channel")
        pos += got
    return buf


class Channel:
    """One authenticated connection: :meth:`send` / :meth:`recv` whole Python objects."""

    def __init__(self, sock, timeout: float | None = None):
        self.sock = sock
        self._rbuf = bytearray()  # bytes received beyond the last message
        sock.settimeout(timeout)

    @property
    def tls(self) -> bool:
        return isinstance(self.sock, ssl.SSLSocket)

    def send_frame(self, frame: list) -> None:
        for part in frame:
            self.sock.sendall(part)

    def send(self, obj) -> None:
        self.send_frame(encode(obj))

    def _take(self, n: int) -> bytearray:
        """The next ``n`` bytes: small reads go through a buffer (one system call for a small
        message), large ones straight into their final buffer."""
        buf = self._rbuf
        if len(buf) >= n:
            out = buf[:n]
            del buf[:n]
            return out
        out = bytearray(n)
        pos = len(buf)
        out[:pos] = buf
        buf.clear()
        view = memoryview(out)
        while pos < n:
            if n - pos >= _SMALL:
                got = self.sock.recv_into(view[pos:], n - pos)
                if not got:
                    raise EOFError("the peer closed the channel")
                pos += got
                continue
            chunk = self.sock.recv(_SMALL)
            if not chunk:
                raise EOFError("the peer closed the channel")
            used = min(len(chunk), n - pos)
            view[pos : pos + used] = chunk[:used]
            buf += chunk[used:]
            pos += used
        return out

    def recv(self):
        """The next object; ``EOFError`` when the peer closed, ``TimeoutError`` past the timeout."""
        n_buffers, n_body = _HEAD.unpack(self._take(_HEAD.size))
        sizes = struct.unpack(f"!{n_buffers}Q", self._take(8 * n_buffers)) if n_buffers else ()
        body = self._take(n_body)
        buffers = [self._take(size) for size in sizes]
        return pickle.loads(body, buffers=buffers)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _nodelay(sock) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


def _server_handshake(sock, secret: bytes) -> None:
    nonce = secrets.token_bytes(_NONCE)
    sock.sendall(_MAGIC + nonce)
    reply = _recv_exact(sock, 2 * _NONCE)
    if not hmac.compare_digest(bytes(reply[:_NONCE]), _mac(secret, b"driver", nonce)):
        raise PermissionError("the peer does not know the fit's secret")
    sock.sendall(_mac(secret, b"shard", bytes(reply[_NONCE:]), nonce))


def _client_handshake(sock, secret: bytes) -> None:
    hello = _recv_exact(sock, len(_MAGIC) + _NONCE)
    if bytes(hello[: len(_MAGIC)]) != _MAGIC:
        raise ConnectionError("the peer is not an mwumkl shard")
    theirs = bytes(hello[len(_MAGIC) :])
    mine = secrets.token_bytes(_NONCE)
    sock.sendall(_mac(secret, b"driver", theirs) + mine)
    if not hmac.compare_digest(bytes(_recv_exact(sock, _NONCE)), _mac(secret, b"shard", mine, theirs)):
        raise PermissionError("the shard does not know the fit's secret")


class Listener:
    """A shard's listening socket: hands out the first peer that authenticates, ignores the rest.

    ``ssl_context``: a server-side context (TLS), or None (plaintext). Every incoming
    connection gets a handshake thread of its own, so a silent or slow stranger delays nobody.
    """

    def __init__(self, host: str, secret: bytes, ssl_context=None, handshake_timeout: float = HANDSHAKE_TIMEOUT):
        self._secret = secret
        self._ssl = ssl_context
        self._handshake_timeout = handshake_timeout
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self.address = self._sock.getsockname()[:2]
        self._ready: queue.Queue = queue.Queue()
        self._pending = threading.BoundedSemaphore(MAX_PENDING)
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.rejected = 0  # connections closed for failing the handshake (strangers)
        threading.Thread(target=self._accept_loop, name="mwumkl-channel-accept", daemon=True).start()

    @property
    def tls(self) -> bool:
        return self._ssl is not None

    def _accept_loop(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            if self._done.is_set() or not self._pending.acquire(blocking=False):
                conn.close()
                continue
            threading.Thread(target=self._handshake, args=(conn,), name="mwumkl-channel-auth", daemon=True).start()

    def _handshake(self, conn) -> None:
        sock = conn
        try:
            conn.settimeout(self._handshake_timeout)
            _nodelay(conn)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(conn, server_side=True)
            _server_handshake(sock, self._secret)
        except (OSError, EOFError, ValueError, PermissionError):
            with self._lock:
                self.rejected += 1
            sock.close()
            conn.close()
            return
        finally:
            self._pending.release()
        if self._done.is_set():
            sock.close()
            return
        self._ready.put(sock)

    def accept(self, timeout: float | None = None) -> Channel:
        """Wait for the authenticated driver; stop listening once it is here (``TimeoutError``)."""
        try:
            sock = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no authenticated peer connected in time") from None
        self.close()
        return Channel(sock, None)

    def close(self) -> None:
        """Stop listening (a shutdown wakes the accept loop: closing alone would not)."""
        self._done.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def connect(
    address, secret: bytes, ssl_context=None, timeout: float | None = None, handshake_timeout: float = HANDSHAKE_TIMEOUT
) -> Channel:
    """Connect to a shard's :class:`Listener` and authenticate both ways; ``timeout`` bounds each receive."""
    host, port = address[0], int(address[1])
    sock = socket.create_connection((host, port), timeout=handshake_timeout)
    try:
        _nodelay(sock)
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname=host if ssl_context.check_hostname else None)
        _client_handshake(sock, secret)
    except BaseException:
        sock.close()
        raise
    return Channel(sock, timeout)
