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
* **Strangers can neither hang nor break a fit**: the shard listens only on its worker's host;
  the thread waiting for the driver (:meth:`Listener.accept`) accepts and runs every handshake
  without ever waiting on a peer (a selector), gives
  each connection :data:`HANDSHAKE_TIMEOUT` seconds from its arrival, closes it at its first wrong
  byte, and makes room for newcomers by closing the oldest waiting stranger (never by refusing
  the newcomer), and runs the steps of handshakes under way before those of fresh connections,
  so no number of silent, slow or garbage-sending peers keeps the driver out; it stops listening
  once the driver is in.  The driver retries a failed connection until its deadline
  (:class:`mwumkl_dist.engines.dask_pool.DaskPool`), so a stranger can at most delay it.

Messages are pickles (the peer is authenticated) in length-prefixed frames; pickle protocol 5
sends numpy arrays out of band, as raw bytes received straight into their final buffer. A frame
is encoded once and may be sent to many peers (:func:`encode` + :meth:`Channel.send_frame`).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import pickle
import secrets
import selectors
import socket
import ssl
import struct
import threading
import time

__all__ = ["HANDSHAKE_TIMEOUT", "MAX_PENDING", "Channel", "Listener", "connect", "encode", "new_secret"]

#: Seconds a peer has, from its arrival, to complete the TLS and HMAC handshakes (the driver
#: needs a few round trips; a stranger holds a descriptor at most this long).
HANDSHAKE_TIMEOUT = 5.0
#: The most unauthenticated connections one listener keeps at once (see :class:`Listener`).
MAX_PENDING = 4096
_BACKLOG = 1024  # the kernel's queue of connections not yet accepted (capped by somaxconn)
_BATCH = 32  # fresh peers given a handshake step per round of the listener's loop (and 4x that accepted)
_ALIVE_EVERY = 0.25  # seconds between two looks at accept's ``alive``

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

    @property
    def buffered(self) -> bool:
        """Whether bytes of a message are already here (read ahead, or decrypted by TLS): no need to wait."""
        return bool(self._rbuf) or (isinstance(self.sock, ssl.SSLSocket) and self.sock.pending() > 0)

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


def _client_handshake(sock, secret: bytes) -> None:
    hello = _recv_exact(sock, len(_MAGIC) + _NONCE)
    if bytes(hello[: len(_MAGIC)]) != _MAGIC:
        raise ConnectionError("the peer is not an mwumkl shard")
    theirs = bytes(hello[len(_MAGIC) :])
    mine = secrets.token_bytes(_NONCE)
    sock.sendall(_mac(secret, b"driver", theirs) + mine)
    if not hmac.compare_digest(bytes(_recv_exact(sock, _NONCE)), _mac(secret, b"shard", mine, theirs)):
        raise PermissionError("the shard does not know the fit's secret")


class _Peer:
    """An incoming connection still in its handshake (see :class:`Listener`)."""

    __slots__ = ("conn", "sock", "deadline", "tls_pending", "out", "after_out", "got", "nonce", "events", "steps")

    def __init__(self, conn, sock, deadline: float, tls: bool):
        self.conn, self.sock, self.deadline = conn, sock, deadline
        self.tls_pending = tls  # the TLS handshake comes first
        self.nonce = secrets.token_bytes(_NONCE)
        self.out = b""  # bytes still to send
        self.after_out = "challenge"  # what comes once ``out`` is sent: "challenge" (to send), "reply", "done"
        self.got = bytearray()  # the driver's reply so far
        self.events = 0  # what the selector waits for
        self.steps = 0  # handshake steps run so far (peers under way go before fresh ones)


class Listener:
    """A shard's listening socket: hands out the first peer that authenticates, ignores the rest.

    ``ssl_context``: a server-side context (TLS), or None (plaintext). The thread that calls
    :meth:`accept` accepts and runs every handshake, non-blocking (a selector), so no peer can
    block it: each connection has ``handshake_timeout`` seconds from its arrival to authenticate
    (whatever it sends or withholds) and is closed at the first byte that is wrong. At most
    ``max_pending`` connections wait at once (default: from the process's file-descriptor limit, see
    :func:`max_pending_for_fd_limit`); a newcomer beyond that, or a refused ``accept`` for want
    of descriptors, closes the *oldest* waiting one, so new connections (the driver's, which
    authenticates within a round trip) always get their turn; nothing is ever refused at the door.
    ``rejected`` counts the connections closed without authenticating (``evicted``: of them,
    those closed to make room).  No thread of its own: a shard's server starts none per shard
    (see :class:`mwumkl_dist.engines.dask_pool.ShardServer`).
    """

    def __init__(
        self,
        host: str,
        secret: bytes,
        ssl_context=None,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        max_pending: int | None = None,
    ):
        self._secret = secret
        self._ssl = ssl_context
        self._handshake_timeout = float(handshake_timeout)
        self.max_pending = max_pending_for_fd_limit() if max_pending is None else max(1, int(max_pending))
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.bind((host, 0))
            self._sock.listen(_BACKLOG)
            self._sock.setblocking(False)
            self.address = self._sock.getsockname()[:2]
            self._wake_r, self._wake_w = socket.socketpair()  # close() wakes the loop through it
        except BaseException:
            self._sock.close()
            raise
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._running = False  # an accept() runs the loop (it closes the sockets when it ends)
        self._won: list = []  # authenticated sockets: the first is the driver's
        self.rejected = 0  # connections closed for failing the handshake (strangers)
        self.evicted = 0  # of them, the oldest waiting ones closed to make room

    @property
    def tls(self) -> bool:
        return self._ssl is not None

    @property
    def closed(self) -> bool:
        return self._done.is_set()

    # ------------------------------------------------------------------ the loop (accept's thread)
    def _run(self, deadline: float | None, alive):
        """Handshakes until a peer authenticates (its socket), the deadline, ``alive()`` false, or close()."""
        sel = selectors.DefaultSelector()
        pending: dict[_Peer, None] = {}  # insertion order = arrival order = deadline order
        try:
            sel.register(self._sock, selectors.EVENT_READ, None)
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            look = time.monotonic() + _ALIVE_EVERY
            while not self._done.is_set():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise TimeoutError("no authenticated peer connected in time")
                if alive is not None and now >= look:
                    if not alive():
                        raise EOFError("the listener's owner is gone")
                    look = now + _ALIVE_EVERY
                waits = [next(iter(pending)).deadline] if pending else []
                waits += ([] if deadline is None else [deadline]) + ([] if alive is None else [look])
                events = sel.select(max(0.0, min(waits) - now) if waits else None)
                ready = [key.data for key, _ in events if isinstance(key.data, _Peer)]
                # Peers under way first (the driver, once its first message parsed), then a bounded
                # batch of the oldest fresh ones, then new connections: a flood of fresh strangers
                # delays each step of the driver's handshake by one batch, not by the whole flood.
                fresh = sorted((p for p in ready if not p.steps), key=lambda p: p.deadline)
                for peer in [p for p in ready if p.steps] + fresh[:_BATCH]:
                    if peer in pending:
                        self._advance(sel, pending, peer)
                if any(key.data is None for key, _ in events):
                    self._accept_some(sel, pending)
                if self._won:
                    return self._won.pop(0)
                now = time.monotonic()
                while pending and next(iter(pending)).deadline <= now:  # too slow, or silent
                    self._drop(sel, pending, next(iter(pending)))
            raise EOFError("the listener was closed")
        except (TimeoutError, EOFError):
            raise
        except Exception as exc:  # pragma: no cover - a bug here must not leave the shard listening
            raise EOFError(f"the listener failed: {type(exc).__name__}: {exc}") from exc
        finally:
            for peer in list(pending):
                self._drop(sel, pending, peer)
            for extra in self._won:  # authenticated after the driver: nobody will use them
                extra.close()
            self._won = []
            sel.close()
            self._close_sockets()

    def _close_sockets(self) -> None:
        for s in (self._sock, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass

    def _accept_some(self, sel, pending: dict) -> None:
        for _ in range(_BATCH * 4):  # cheap each (no handshake step yet on TLS); bounded per round
            if self._done.is_set():
                return
            try:
                conn, _ = self._sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM) and pending:
                    self._drop(sel, pending, next(iter(pending)), evicted=True)  # a descriptor for the newcomer
                    continue
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # that one gave up while queued
                time.sleep(0.05)  # out of descriptors with nothing of ours to free: let others close some
                return
            if len(pending) >= self.max_pending:
                self._drop(sel, pending, next(iter(pending)), evicted=True)
            self._start(sel, pending, conn)

    def _start(self, sel, pending: dict, conn) -> None:
        sock = conn
        try:
            conn.setblocking(False)
            _nodelay(conn)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError):
            self._count_rejected()
            sock.close()
            conn.close()
            return
        peer = _Peer(conn, sock, time.monotonic() + self._handshake_timeout, self._ssl is not None)
        pending[peer] = None
        if self._ssl is None:
            self._advance(sel, pending, peer)  # our challenge goes first
        else:
            self._watch(sel, peer, selectors.EVENT_READ)  # the peer's first TLS message comes first

    def _advance(self, sel, pending: dict, peer: _Peer) -> None:
        """Run ``peer``'s handshake as far as it goes without waiting; then wait for what it needs."""
        sock = peer.sock
        try:
            peer.steps += 1
            while True:
                if peer.tls_pending:
                    sock.do_handshake()
                    peer.tls_pending = False
                if peer.out:
                    sent = sock.send(peer.out)
                    peer.out = peer.out[sent:]
                    continue
                if peer.after_out == "challenge":
                    peer.out, peer.after_out = _MAGIC + peer.nonce, "reply"
                elif peer.after_out == "reply":
                    chunk = sock.recv(2 * _NONCE - len(peer.got))  # never beyond the reply
                    if not chunk:
                        raise EOFError("the peer closed the channel")
                    peer.got += chunk
                    if len(peer.got) == 2 * _NONCE:
                        if not hmac.compare_digest(bytes(peer.got[:_NONCE]), _mac(self._secret, b"driver", peer.nonce)):
                            raise PermissionError("the peer does not know the fit's secret")
                        peer.out = _mac(self._secret, b"shard", bytes(peer.got[_NONCE:]), peer.nonce)
                        peer.after_out = "done"
                else:  # authenticated, and our proof is sent
                    self._unwatch(sel, peer)
                    del pending[peer]
                    sock.setblocking(True)
                    self._won.append(sock)
                    return
        except ssl.SSLWantReadError:
            self._watch(sel, peer, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            self._watch(sel, peer, selectors.EVENT_WRITE)
        except BlockingIOError:
            self._watch(sel, peer, selectors.EVENT_WRITE if peer.out else selectors.EVENT_READ)
        except (OSError, EOFError, ValueError, PermissionError):  # garbage, a wrong secret, a reset, bad TLS
            self._drop(sel, pending, peer)

    @staticmethod
    def _watch(sel, peer: _Peer, events: int) -> None:
        if peer.events == events:
            return
        if peer.events:
            sel.modify(peer.sock, events, peer)
        else:
            sel.register(peer.sock, events, peer)
        peer.events = events

    @staticmethod
    def _unwatch(sel, peer: _Peer) -> None:
        if peer.events:
            sel.unregister(peer.sock)
            peer.events = 0

    def _drop(self, sel, pending: dict, peer: _Peer, *, evicted: bool = False) -> None:
        """Close a waiting peer (failed, too slow, or the oldest when room is needed)."""
        try:
            self._unwatch(sel, peer)
        except (KeyError, ValueError, OSError):
            pass
        pending.pop(peer, None)
        self._count_rejected(evicted)
        for s in (peer.sock, peer.conn):
            try:
                s.close()
            except OSError:
                pass

    def _count_rejected(self, evicted: bool = False) -> None:
        with self._lock:
            self.rejected += 1
            self.evicted += evicted

    # ------------------------------------------------------------------ the shard's side
    def accept(self, timeout: float | None = None, alive=None) -> Channel:
        """Run the handshakes until the driver is in (its channel); the listener closes when this returns.

        ``TimeoutError`` when no peer authenticated within ``timeout`` seconds; ``EOFError``
        when the listener was closed (before or meanwhile), or when ``alive`` (a callable, looked
        at a few times a second) returns false: an owner held only weakly stops the wait once it
        is gone, without a finalizer.  Called once.
        """
        with self._lock:
            if self._done.is_set():
                raise EOFError("the listener was closed")
            self._running = True
        try:
            sock = self._run(None if timeout is None else time.monotonic() + timeout, alive)
        finally:
            with self._lock:
                self._running = False
                self._done.set()
        return Channel(sock, None)

    def close(self) -> None:
        """Stop listening: the waiting peers and the listening socket are closed (by a running accept's loop)."""
        with self._lock:
            if self._done.is_set():
                return
            self._done.set()
            running = self._running
        if not running:
            self._close_sockets()
            return
        try:  # no new connection from now on (a listening socket's shutdown refuses them at once)
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass


def max_pending_for_fd_limit() -> int:
    """How many unauthenticated connections a listener keeps waiting at once.

    A quarter of the process's soft limit on open files (several shards may listen in one
    worker, which has descriptors of its own), between 16 and :data:`MAX_PENDING`; the
    listener also evicts its oldest waiting peer when ``accept`` finds no descriptor left.
    """
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY or soft <= 0:
            soft = 1 << 16
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        soft = 1024
    return int(min(MAX_PENDING, max(16, soft // 4)))


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
