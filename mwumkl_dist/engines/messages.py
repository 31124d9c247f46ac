"""The MWU superstep's messages in fixed binary layouts, for shards that live in other processes.

Pickled, a superstep's message (two points and the coefficients) and each shard's answer (two
:class:`~mwumkl_dist.core.mwu_rules.Candidate` objects, each with its ``V`` row and its point) cost
tens of microseconds to encode and decode on each side, every superstep.  Here each is one
``bytes`` value laid out with :mod:`struct` and numpy, little-endian, 8-byte fields:

* the message, :func:`pack_step`: ``ip, iq, point p, point q, m, coef[m]``;
* a shard's answer, :func:`superstep` (run where the shard lives): a fixed header
  ``index+, g+, index-, g-, offset of the second body`` and then each candidate's body
  ``m, V row[m], point``;
* the rows a kernel-sharded layout fetches after its Find-alpha, :func:`fetch_rows`: per row
  asked, ``1`` and the body (``0`` for a row the shard does not hold).

A message is encoded once for all the shards that take it (a pool sends the same bytes to each);
:func:`best_candidates` reduces the answers by their headers alone and decodes the bodies of the two
winners only, so the driver's work per shard does not grow with the number of kernels.  A point is
``tag`` and then: nothing (none), the row index (precomputed kernels), ``n_features, nnz,
indices[nnz], values[nnz]`` (:class:`~mwumkl_dist.kernels.evaluation.SparsePoint`), ``n, values[n]``
(a dense float64 vector), or, for any other kind, ``length, pickle`` (zero-padded to 8 bytes).  Decoded arrays are
writable, aligned views of one copy of the bytes (numba compiles one specialisation per array kind: a
read-only array would compile another).
"""

from __future__ import annotations

import pickle
import struct
import sys

import numpy as np

from mwumkl_dist.core.mwu_rules import Candidate, best_of
from mwumkl_dist.kernels.evaluation import SparsePoint

__all__ = [
    "pack_step",
    "unpack_step",
    "pack_candidates",
    "best_candidates",
    "superstep",
    "superstep_scores",
    "fetch_rows",
    "unpack_rows",
]

_NONE, _INDEX, _SPARSE, _DENSE, _PICKLED = range(5)
_ONE = struct.Struct("<q")
_TWO = struct.Struct("<qq")
_THREE = struct.Struct("<qqq")
_HEAD = struct.Struct("<qdqdq")  # an answer's header: index+, g+, index-, g-, offset of the second body
_F8 = np.dtype("<f8")
_I8 = np.dtype("<i8")
_NATIVE = sys.byteorder == "little"  # the layouts' byte order: decoded arrays are views


def _point_parts(point) -> list:
    if point is None:
        return [_ONE.pack(_NONE)]
    if isinstance(point, SparsePoint):
        idx, val = point.entries()
        return [
            _THREE.pack(_SPARSE, point.n_features, len(idx)),
            idx.astype(_I8, copy=False),
            val.astype(_F8, copy=False),
        ]
    if isinstance(point, (int, np.integer)) and not isinstance(point, bool):
        return [_TWO.pack(_INDEX, int(point))]
    if isinstance(point, np.ndarray) and point.ndim == 1 and point.dtype == np.float64:
        return [_TWO.pack(_DENSE, len(point)), point.astype(_F8, copy=False)]
    body = pickle.dumps(point, protocol=5)
    return [_TWO.pack(_PICKLED, len(body)), body, bytes(-len(body) % 8)]  # padded: the next field stays aligned


def _array_parts(values) -> list:
    values = np.asarray(values, dtype=_F8).ravel()
    return [_ONE.pack(len(values)), values]


def _join(parts) -> bytes:
    return b"".join(p.tobytes() if isinstance(p, np.ndarray) else p for p in parts)


def _view(buf: bytearray, dtype, n: int, pos: int) -> np.ndarray:
    """``n`` values at byte ``pos`` of a writable buffer: a view (every field starts 8-aligned), or native copies."""
    out = np.frombuffer(buf, dtype, n, pos)
    return out if _NATIVE else out.astype(dtype.newbyteorder("="))


def _point(buf, pos: int):
    """``(point, position after it)``."""
    (tag,) = _ONE.unpack_from(buf, pos)
    pos += 8
    if tag == _NONE:
        return None, pos
    if tag == _SPARSE:
        n_features, nnz = _TWO.unpack_from(buf, pos)
        pos += 16
        idx, val = _view(buf, _I8, nnz, pos), _view(buf, _F8, nnz, pos + 8 * nnz)
        return SparsePoint(idx, val, n_features), pos + 16 * nnz
    (n,) = _ONE.unpack_from(buf, pos)
    pos += 8
    if tag == _INDEX:
        return n, pos
    if tag == _DENSE:
        return _view(buf, _F8, n, pos), pos + 8 * n
    if tag == _PICKLED:
        return pickle.loads(bytes(buf[pos : pos + n])), pos + n + -n % 8
    raise ValueError(f"unknown point tag {tag} in a superstep message")


def _array(buf, pos: int):
    (n,) = _ONE.unpack_from(buf, pos)
    return _view(buf, _F8, n, pos + 8), pos + 8 + 8 * n


def pack_step(ip: int, iq: int, p, q, coef: np.ndarray) -> bytes:
    """A superstep's message: the picked rows ``ip`` / ``iq``, their points and the coefficients."""
    return _join([_TWO.pack(int(ip), int(iq)), *_point_parts(p), *_point_parts(q), *_array_parts(coef)])


def unpack_step(message: bytes) -> tuple:
    """``(ip, iq, p, q, coef)``: the arguments of a shard's ``superstep``."""
    buf = bytearray(message)
    ip, iq = _TWO.unpack_from(buf, 0)
    p, pos = _point(buf, 16)
    q, pos = _point(buf, pos)
    coef, _ = _array(buf, pos)
    return ip, iq, p, q, coef


def _body(c: Candidate) -> list:
    return [*_array_parts(() if c.v_row is None else c.v_row), *_point_parts(c.point)]


def pack_candidates(pos: Candidate, neg: Candidate) -> bytes:
    """A shard's two candidates: the header (rows and scores), then each one's ``V`` row and point."""
    first = _join(_body(pos))
    return _HEAD.pack(pos.index, pos.g, neg.index, neg.g, _HEAD.size + len(first)) + first + _join(_body(neg))


def _candidate(answer: bytes, index: int, g: float, pos: int) -> Candidate:
    buf = bytearray(answer)
    v_row, pos = _array(buf, pos)
    point, _ = _point(buf, pos)
    return Candidate(index, g, v_row, point)


def best_candidates(answers) -> tuple[Candidate, Candidate]:
    """The best candidate of each class over the shards' packed answers (the rule of :func:`best_of`).

    Only the headers are read to choose; the two winners' bodies are decoded.
    """
    heads = [_HEAD.unpack_from(a, 0) for a in answers]
    k = best_of([Candidate(h[0], h[1]) for h in heads])
    pos = _candidate(answers[k], heads[k][0], heads[k][1], _HEAD.size)
    k = best_of([Candidate(h[2], h[3]) for h in heads])
    return pos, _candidate(answers[k], heads[k][2], heads[k][3], heads[k][4])


def superstep(shard, message: bytes) -> bytes:
    """The shard's ``superstep`` on a packed message, its candidates packed (runs where the shard lives)."""
    return pack_candidates(*shard.superstep(*unpack_step(message)))


def superstep_scores(shard, message: bytes) -> np.ndarray:
    """The shard's ``superstep_scores`` on a packed message (its tile partials, an array)."""
    return shard.superstep_scores(*unpack_step(message))


def fetch_rows(shard, rows) -> bytes:
    """``V`` row and point of each of the shard's local ``rows`` (-1: not the shard's), packed (runs where it lives)."""
    parts = []
    for local in rows:
        if local < 0:
            parts.append(_ONE.pack(0))
        else:
            parts += [_ONE.pack(1), *_array_parts(shard.V[local]), *_point_parts(shard.point(local))]
    return _join(parts)


def unpack_rows(answer: bytes, n_rows: int) -> list:
    """:func:`fetch_rows`'s answer: ``(V row, point)`` per row asked, None for a row the shard does not hold."""
    buf = bytearray(answer)
    out, pos = [], 0
    for _ in range(n_rows):
        (held,) = _ONE.unpack_from(buf, pos)
        pos += 8
        if not held:
            out.append(None)
            continue
        v_row, pos = _array(buf, pos)
        point, pos = _point(buf, pos)
        out.append((v_row, point))
    return out
