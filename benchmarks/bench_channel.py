"""Superstep transport latency: our shard channel against ``distributed.comm``, Dask actors and submit.

Run on demand (not a test)::

    python benchmarks/bench_channel.py                 # plain and TLS, 2000 round trips per case
    python benchmarks/bench_channel.py --rounds 200    # quicker
    python benchmarks/bench_channel.py --security plain --out /tmp/c.json

The Dask engine talks to each shard over a socket of its own
(``mwumkl_dist/engines/channel.py``) on the ground that a Dask actor round trip
costs several ms.  This script measures that claim.  On a ``LocalCluster`` of 2
worker processes with 1 thread each (once plaintext, once with TLS from
``Security.temporary()``, which requires encryption) it times the round trip of a
superstep-sized exchange over each transport:

* ``channel``: the engine's own path.  A :class:`~mwumkl_dist.engines.dask_pool.ShardServer`
  actor per worker (with a stand-in shard whose ``superstep`` echoes), listening with
  the worker's ``Security.get_listen_args("worker")`` TLS context on TLS clusters; the
  driver connects with ``_channel.connect``, the per-fit HMAC secret and the client's
  ``Security.get_connection_args("client")`` context, encodes the ``("superstep", args)``
  message once and sends the same frame to every shard (as ``DaskEngine._broadcast``).
* ``comm``: ``distributed.comm`` directly.  A ``distributed.comm.listen`` listener on
  each worker's event loop (started by ``client.run``; the worker's listen arguments),
  ``distributed.comm.connect`` from an asyncio loop in the driver (the client's
  connection arguments); the arguments travel as ``ToPickle`` (pickle protocol 5,
  numpy buffers as frames of their own).  The handler answers on the event loop.
* ``comm_thread``: the same, but the handler runs the step in a thread
  (``asyncio.to_thread``), as a real shard must: a superstep's compute would otherwise
  block the worker's event loop (heartbeats, the scheduler's messages).
* ``actor``: a Dask actor method call, ``actor.superstep(...).result()``.
* ``submit``: ``client.submit(superstep, ..., workers=[w]).result()``, for scale
  (``--submit-rounds``, default 500).

Two messages: ``small`` (two row indices, two 2-float points and 3 kernel coefficients;
the reply: two candidates, each an index, a score, 3 ``V`` values and its 2-float point)
and ``point`` (the same with ``--dim`` = 1000-float points: 16 kB each way, a real
superstep's two points and two candidates).  Two patterns: ``both`` (send to both
workers, then receive both replies: a superstep) and ``one`` (the first worker only).
Each (transport, pattern, message) gets ``--warmup`` discarded round trips, then
``--rounds`` timed ones, in ``--blocks`` chunks interleaved over all cases, so drift of
the shared machine's load spreads over every case alike.  Reported per case: median,
p10, p90, mean and min in ms (wall clock, ``time.perf_counter``).

Outputs: ``benchmarks/results/channel_latency.json`` (every figure, the machine, the
versions) and ``channel_latency.md`` beside it (``--out`` moves both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import platform
import ssl
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, os.path.dirname(HERE))  # run as a script: make the benchmarks package importable

from benchmarks.common import run_info  # noqa: E402

TRANSPORTS = ("channel", "comm", "comm_thread", "actor", "submit")
PATTERNS = ("both", "one")
MESSAGES = ("small", "point")
SECURITY = ("plain", "tls")
N_KERNELS = 3


# ---------------------------------------------------------------------- the stand-in shard
def superstep(ip, iq, p, q, coef):
    """The shard's answer: two candidates ``(index, g, v_row, point)`` of the size a real one sends."""
    return (ip, 0.5, coef * 2.0, p), (iq, -0.5, coef * 3.0, q)


class EchoShard:
    """What ``ShardServer`` holds: a shard whose superstep only echoes."""

    def superstep(self, ip, iq, p, q, coef):
        return superstep(ip, iq, p, q, coef)


def echo_shard():
    return EchoShard()


class EchoActor:
    """A plain Dask actor answering the same superstep."""

    def superstep(self, ip, iq, p, q, coef):
        return superstep(ip, iq, p, q, coef)


def message(kind: str, dim: int) -> tuple:
    d = 2 if kind == "small" else dim
    rng = np.random.default_rng(0)
    return (17, 42, rng.random(d), rng.random(d), rng.random(N_KERNELS))


def _check(reply, args) -> None:
    (i, _, _, p), (j, _, _, q) = reply
    if i != args[0] or j != args[1] or len(p) != len(args[2]) or len(q) != len(args[3]):
        raise AssertionError("wrong reply")


# ---------------------------------------------------------------------- distributed.comm, worker side
async def _start_comm_server(threaded: bool, dask_worker=None):
    """A ``distributed.comm`` listener on this worker's event loop; its contact address."""
    from distributed.comm import CommClosedError, listen
    from distributed.protocol import ToPickle

    from mwumkl_dist.engines.dask_pool import listen_host

    scheme = dask_worker.address.split("://", 1)[0]

    async def handle(comm):
        try:
            while True:
                msg = await comm.read()
                if msg.get("op") == "close":
                    break
                args = msg["args"]
                value = await asyncio.to_thread(superstep, *args) if threaded else superstep(*args)
                await comm.write({"status": "ok", "value": ToPickle(value)})
        except (CommClosedError, OSError):
            pass
        finally:
            comm.abort()

    listener = listen(
        f"{scheme}://{listen_host(dask_worker.address)}:0",
        handle,
        deserialize=True,
        **dask_worker.security.get_listen_args("worker"),
    )
    await listener.start()
    if not hasattr(dask_worker, "_bench_comm_listeners"):
        dask_worker._bench_comm_listeners = []
    dask_worker._bench_comm_listeners.append(listener)
    return listener.contact_address


def _stop_comm_servers(dask_worker=None):
    for listener in getattr(dask_worker, "_bench_comm_listeners", []):
        listener.stop()
    dask_worker._bench_comm_listeners = []


# ---------------------------------------------------------------------- the transports, driver side
class _Transport:
    """``round(targets, args)``: one exchange with the workers ``targets`` (indices), timed by the caller."""

    def close(self) -> None:
        pass


class ChannelTransport(_Transport):
    def __init__(self, client, workers):
        from mwumkl_dist.engines import channel as _channel
        from mwumkl_dist.engines.dask_pool import ShardServer

        self._channel = _channel
        self.secret = _channel.new_secret()
        self.futures = [
            client.submit(ShardServer, echo_shard, self.secret, 60.0, actor=True, workers=[w], pure=False)
            for w in workers
        ]
        security = client.security
        self.conns = []
        for w, fut in zip(workers, self.futures):
            host, port, tls = fut.result(timeout=60).address().result(timeout=60)
            ctx = security.get_connection_args("client")["ssl_context"] if tls else None
            if w.startswith("tls://") and ctx is None:
                raise RuntimeError("the cluster uses TLS but the shard channel would not")
            self.conns.append(_channel.connect((host, port), self.secret, ctx, timeout=60.0))
        self.tls = all(c.tls for c in self.conns)

    def round(self, targets, args):
        frame = self._channel.encode(("superstep", args))  # once, the same bytes to every shard
        for t in targets:
            self.conns[t].send_frame(frame)
        out = []
        for t in targets:
            status, value = self.conns[t].recv()
            if status != "ok":
                raise RuntimeError(value)
            out.append(value)
        return out

    def close(self):
        for c in self.conns:
            try:
                c.send(("close", ()))
                c.recv()
            except (OSError, EOFError):
                pass
            c.close()
        for f in self.futures:
            f.release()


class CommTransport(_Transport):
    def __init__(self, client, workers, threaded: bool):
        from distributed.comm import connect
        from distributed.protocol import ToPickle

        self._to_pickle = ToPickle
        self.client, self.workers = client, workers
        self.loop = asyncio.new_event_loop()
        addresses = [
            client.run(_start_comm_server, threaded, workers=[w])[w] for w in workers
        ]  # one listener per worker
        args = client.security.get_connection_args("client")

        async def connect_all():
            return [await connect(a, deserialize=True, **args) for a in addresses]

        self.comms = self.loop.run_until_complete(connect_all())
        self.tls = all(a.startswith("tls://") for a in addresses)

    async def _round(self, targets, args):
        msg = {"op": "step", "args": self._to_pickle(args)}
        for t in targets:
            await self.comms[t].write(msg)
        out = []
        for t in targets:
            reply = await self.comms[t].read()
            out.append(reply["value"])
        return out

    def timed(self, targets, args, n: int) -> list[float]:
        """``n`` timed round trips inside the event loop (no thread hop per round)."""

        async def run():
            times = []
            for _ in range(n):
                start = time.perf_counter()
                out = await self._round(targets, args)
                times.append(time.perf_counter() - start)
            for reply in out:
                _check(reply, args)
            return times

        return self.loop.run_until_complete(run())

    def close(self):
        async def close_all():
            for c in self.comms:
                try:
                    await c.write({"op": "close"})
                except Exception:  # noqa: BLE001 - best effort
                    pass
                await c.close()

        self.loop.run_until_complete(close_all())
        self.loop.close()
        self.client.run(_stop_comm_servers, workers=self.workers)


class ActorTransport(_Transport):
    def __init__(self, client, workers):
        self.futures = [client.submit(EchoActor, actor=True, workers=[w], pure=False) for w in workers]
        self.actors = [f.result(timeout=60) for f in self.futures]

    def round(self, targets, args):
        futures = [self.actors[t].superstep(*args) for t in targets]
        return [f.result() for f in futures]

    def close(self):
        for f in self.futures:
            f.release()


class SubmitTransport(_Transport):
    def __init__(self, client, workers):
        self.client, self.workers = client, workers

    def round(self, targets, args):
        futures = [self.client.submit(superstep, *args, workers=[self.workers[t]], pure=False) for t in targets]
        return self.client.gather(futures)


def _timed(transport, targets, args, n: int) -> list[float]:
    if isinstance(transport, CommTransport):
        return transport.timed(targets, args, n)
    times = []
    out = None
    for _ in range(n):
        start = time.perf_counter()
        out = transport.round(targets, args)
        times.append(time.perf_counter() - start)
    for reply in out or ():
        _check(reply, args)
    return times


def _stats(times: list[float]) -> dict:
    ms = np.asarray(times) * 1e3
    p10, p50, p90 = np.percentile(ms, [10, 50, 90])
    return {
        "n": int(ms.size),
        "median_ms": float(p50),
        "p10_ms": float(p10),
        "p90_ms": float(p90),
        "mean_ms": float(ms.mean()),
        "min_ms": float(ms.min()),
    }


# ---------------------------------------------------------------------- one cluster
def measure(security_mode: str, args) -> tuple[list[dict], dict]:
    from distributed import Client, LocalCluster
    from distributed.security import Security

    kw = dict(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    security = None
    if security_mode == "tls":
        security = Security.temporary()  # self-signed CA and certificate; require_encryption=True
        kw.update(protocol="tls://", security=security)
    rows, info = [], {}
    with LocalCluster(**kw) as cluster, Client(cluster, security=security) as client:
        workers = sorted(client.nthreads())
        info["workers"] = workers
        if security_mode == "tls" and not all(w.startswith("tls://") for w in workers):
            raise RuntimeError(f"TLS cluster with non-TLS workers: {workers}")
        makers = {
            "channel": lambda: ChannelTransport(client, workers),
            "comm": lambda: CommTransport(client, workers, threaded=False),
            "comm_thread": lambda: CommTransport(client, workers, threaded=True),
            "actor": lambda: ActorTransport(client, workers),
            "submit": lambda: SubmitTransport(client, workers),
        }
        transports = {name: makers[name]() for name in args.transports}
        info["encrypted"] = {name: bool(getattr(t, "tls", security_mode == "tls")) for name, t in transports.items()}
        try:
            messages = {kind: message(kind, args.dim) for kind in MESSAGES}
            targets = {"both": list(range(len(workers))), "one": [0]}
            cases = [(t, p, m) for t in transports for p in PATTERNS for m in MESSAGES]

            def rounds(name):
                return args.submit_rounds if name == "submit" else args.rounds

            def warmup(name):
                return max(1, args.warmup // 4) if name == "submit" else args.warmup

            for t, p, m in cases:
                _timed(transports[t], targets[p], messages[m], warmup(t))
            times = {case: [] for case in cases}
            for block in range(args.blocks):
                for t, p, m in cases:
                    total = rounds(t)
                    n = total * (block + 1) // args.blocks - total * block // args.blocks
                    if n:
                        times[(t, p, m)] += _timed(transports[t], targets[p], messages[m], n)
        finally:
            for t in transports.values():
                t.close()
    for t, p, m in cases:
        msg = messages[m]
        rows.append(
            {
                "security": security_mode,
                "transport": t,
                "pattern": p,
                "message": m,
                "workers_addressed": len(targets[p]),
                "message_pickle_bytes": len(pickle.dumps(msg, protocol=5)),
                "reply_pickle_bytes": len(pickle.dumps(superstep(*msg), protocol=5)),
                "encrypted": info["encrypted"][t],
                **_stats(times[(t, p, m)]),
            }
        )
    return rows, info


# ---------------------------------------------------------------------- summary and outputs
def favoured(rows: list[dict]) -> dict:
    """Per security mode and superstep case (pattern both): the transport with the lowest median."""
    out = {}
    for sec in sorted({r["security"] for r in rows}):
        out[sec] = {}
        for m in MESSAGES:
            case = [r for r in rows if r["security"] == sec and r["pattern"] == "both" and r["message"] == m]
            if not case:
                continue
            best = min(case, key=lambda r: r["median_ms"])
            out[sec][m] = {
                "transport": best["transport"],
                "median_ms": best["median_ms"],
                "median_ratio_to_best": {r["transport"]: r["median_ms"] / best["median_ms"] for r in case},
            }
    return out


def versions() -> dict:
    import dask
    import distributed
    import msgpack
    import tornado

    out = {
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "tornado": tornado.version,
        "msgpack": ".".join(map(str, msgpack.version)),
        "openssl": ssl.OPENSSL_VERSION,
        "python_implementation": platform.python_implementation(),
    }
    try:
        import cryptography

        out["cryptography"] = cryptography.__version__
    except ImportError:
        out["cryptography"] = None
    try:
        import lz4

        out["lz4"] = lz4.__version__
    except ImportError:
        out["lz4"] = None  # distributed.comm compresses nothing then
    return out


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    return f"{r['median_ms']:.3f} ({r['p10_ms']:.3f}–{r['p90_ms']:.3f})"


def render_md(doc: dict) -> str:
    mach, st = doc["machine"], doc["settings"]
    lines = [
        "# Superstep transport latency",
        "",
        "Written by `benchmarks/bench_channel.py` (see its docstring for what each transport is). "
        f"Round-trip wall time in ms, **median (p10–p90)** over {st['rounds']} round trips per case "
        f"({st['submit_rounds']} for `submit`) after {st['warmup']} warm-up ones, "
        f"interleaved in {st['blocks']} blocks. "
        f"LocalCluster: {st['workers']} worker processes x {st['threads_per_worker']} thread; `both`: the driver "
        "sends to both workers, then receives both replies (a superstep); `one`: the first worker only. "
        f"`small`: 2-float points (~{doc['message_bytes']['small']} B pickled each way); "
        f"`point`: {st['dim']}-float points (~{doc['message_bytes']['point']} B each way, a real superstep's two "
        "points out and two candidates back).",
        "",
        f"Machine: {mach['cpu']}, {mach['cores']} cores ({mach['available_cpus']} usable), "
        f"{mach['memory_gib']} GiB, {mach['platform']}; shared with other work (load average "
        f"{', '.join(f'{x:.2f}' for x in mach['load_average_start'])} at the start, "
        f"{', '.join(f'{x:.2f}' for x in mach['load_average_end'])} at the end). "
        f"Python {mach['python']}, dask {mach['dask']}, distributed {mach['distributed']}, tornado {mach['tornado']}, "
        f"{mach['openssl']}, cryptography {mach['cryptography']}, lz4 {mach['lz4'] or 'not installed'}; "
        f"commit {mach['git_commit']}. Total run {doc['total_s']:.0f} s.",
        "",
        "| security | transport | both, small | both, point | one, small | one, point |",
        "|---|---|---|---|---|---|",
    ]
    index = {(r["security"], r["transport"], r["pattern"], r["message"]): r for r in doc["rows"]}
    for sec in st["security"]:
        for t in st["transports"]:
            cells = [_cell(index.get((sec, t, p, m))) for p in PATTERNS for m in MESSAGES]
            lines.append(f"| {sec} | `{t}` | " + " | ".join(cells) + " |")
    lines += ["", "Favoured for the superstep (`both`, lowest median):", ""]
    for sec, per in doc["favoured"].items():
        for m, f in per.items():
            others = ", ".join(
                f"`{t}` {x:.1f}x"
                for t, x in sorted(f["median_ratio_to_best"].items(), key=lambda kv: kv[1])
                if x != 1.0
            )
            lines.append(f"* {sec}, {m}: `{f['transport']}` ({f['median_ms']:.3f} ms); the others' medians: {others}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000, help="timed round trips per case (default 2000)")
    parser.add_argument("--submit-rounds", type=int, default=500, help="the same for submit (default 500)")
    parser.add_argument("--warmup", type=int, default=200, help="discarded round trips per case (default 200)")
    parser.add_argument("--blocks", type=int, default=10, help="chunks the cases are interleaved in (default 10)")
    parser.add_argument("--dim", type=int, default=1000, help="floats per point of the 'point' message (default 1000)")
    parser.add_argument("--security", default="plain,tls", help="comma-separated: plain, tls (default both)")
    parser.add_argument(
        "--transports", default=",".join(TRANSPORTS), help=f"comma-separated subset of {','.join(TRANSPORTS)}"
    )
    parser.add_argument("--out", help="the JSON file (default benchmarks/results/channel_latency.json); .md beside it")
    args = parser.parse_args(argv)
    args.security = [s for s in args.security.split(",") if s]
    args.transports = [t for t in args.transports.split(",") if t]
    if bad := [s for s in args.security if s not in SECURITY] + [t for t in args.transports if t not in TRANSPORTS]:
        parser.error(f"unknown: {', '.join(bad)}")
    args.blocks = max(1, min(args.blocks, args.rounds))
    out_path = args.out or os.path.join(RESULTS, "channel_latency.json")

    machine = {**run_info(), **versions(), "load_average_start": list(os.getloadavg())}
    start = time.perf_counter()
    rows, clusters = [], {}
    for sec in args.security:
        r, info = measure(sec, args)
        rows += r
        clusters[sec] = info
        for row in r:
            print(
                f"{sec:5s} {row['transport']:12s} {row['pattern']:4s} {row['message']:5s} "
                f"median {row['median_ms']:7.3f} ms  p10 {row['p10_ms']:7.3f}  p90 {row['p90_ms']:7.3f}",
                flush=True,
            )
    machine["load_average_end"] = list(os.getloadavg())
    doc = {
        "machine": machine,
        "settings": {
            "workers": 2,
            "threads_per_worker": 1,
            "processes": True,
            "rounds": args.rounds,
            "submit_rounds": args.submit_rounds,
            "warmup": args.warmup,
            "blocks": args.blocks,
            "dim": args.dim,
            "n_kernels": N_KERNELS,
            "security": args.security,
            "transports": args.transports,
            "timer": "time.perf_counter, wall clock per round trip",
        },
        "message_bytes": {m: len(pickle.dumps(message(m, args.dim), protocol=5)) for m in MESSAGES},
        "clusters": clusters,
        "rows": rows,
        "favoured": favoured(rows),
        "total_s": time.perf_counter() - start,
    }
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as fh:
        json.dump(doc, fh, indent=1)
    md_path = os.path.splitext(out_path)[0] + ".md"
    with open(md_path, "w") as fh:
        fh.write(render_md(doc))
    for sec, per in doc["favoured"].items():
        for m, f in per.items():
            print(f"favoured ({sec}, both, {m}): {f['transport']} at {f['median_ms']:.3f} ms")
    print(f"wrote {out_path} and {md_path}")
    return doc


if __name__ == "__main__":
    main()
