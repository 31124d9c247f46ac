"""A crowd of strangers at every shard port at start-up: does the fit end with the same model, and how much later?

Run on demand (not a test)::

    python benchmarks/bench_flood.py                         # plain and TLS, 1000 silent + 1000 garbage
    python benchmarks/bench_flood.py --security plain --repeats 1 --crowd 200
    python benchmarks/bench_flood.py --fd-limit 1024         # workers under the common `ulimit -n`

Issue 21's target: "1,000 silent and 1,000 garbage connections at start-up: the fit ends with
the bit-identical model, at most 2 s later than without them".  On a process ``LocalCluster``
(2 workers, 1 thread each; with ``--security tls`` a ``Security.temporary()`` cluster, which
requires encryption) the script fits ``MWUMKLClassifier(engine="dask", n_shards=2)`` on a
synthetic problem, alternately without and with a crowd:

* an *attacker* process (its own file-descriptor limit) is told each new shard port the
  moment the driver learns it, before the driver connects, and opens ``--crowd`` silent
  connections and ``--crowd`` connections that send 512 random bytes, interleaved, as fast
  as it can; it keeps them all open until the fit ends;
* the driver waits until the attacker has opened ``--wait`` of them (``all``: the whole crowd
  is there before the driver, the worst case; ``100``: the rest arrive while the driver
  connects and computes), then connects.

Reported per security and case (median of ``--repeats``): the fit's wall time, the time the
driver spent waiting for the attacker (the crowd's own speed, not the shard's), the fit time
without that wait, the slowest of the driver's connections to a shard, and whether the model
(``dual_coef_``, ``support_``, ``kernel_weights_``, ``intercept_``) is bit-identical to the
fit without a crowd.  Written to ``benchmarks/results/flood.json`` and ``flood.md`` (``--out``;
``--wait 100`` and ``--fd-limit N`` add ``_wait100`` and ``_fdN`` to the names).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

ATTACKER = r"""
import os, resource, socket, sys, threading, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
crowd, host = int(sys.argv[1]), sys.argv[2]
socks, lock, out = [], threading.Lock(), threading.Lock()

def say(*words):
    with out:
        print(*words, flush=True)

def flood(port):
    start, refused = time.perf_counter(), 0
    for i in range(crowd):
        for garbage in (False, True):
            try:
                s = socket.create_connection((host, port))
                if garbage:
                    s.sendall(os.urandom(512))
            except OSError:  # the shard stopped listening (its driver is in), or closed a garbage one
                refused += 1
                continue
            with lock:
                socks.append(s)
        if i == min(49, crowd - 1):
            say("first", port)  # 100 strangers are in (the whole crowd, if smaller)
    say("done", port, time.perf_counter() - start, refused)

threads = []
for line in sys.stdin:
    word = line.strip()
    if word == "close":
        for t in threads:
            t.join()
        threads = []
        with lock:
            for s in socks:
                s.close()
            socks.clear()
        say("closed")
        continue
    t = threading.Thread(target=flood, args=(int(word),))
    t.start()
    threads.append(t)
"""


def _problem(n: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(n) > 1.0, 1, -1)
    return X, y


class Attacker:
    """The crowd, in a process of its own; one thread per shard port."""

    def __init__(self, crowd: int, host: str = "127.0.0.1"):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ATTACKER, str(crowd), host], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.events: dict = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            words = line.split()
            with self.cond:
                key = (words[0], int(words[1])) if len(words) > 1 else (words[0], None)
                self.events[key] = words[2:]
                self.cond.notify_all()

    def _wait_for(self, key):
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.events or self.proc.poll() is not None, timeout=600):
                raise RuntimeError(f"the attacker never said {key}")
            if key not in self.events:
                raise RuntimeError("the attacker died")
            return self.events.pop(key)

    def crowd(self, port: int, wait: str) -> float:
        """Send the crowd to ``port``; return when ``wait`` says (the seconds spent waiting)."""
        start = time.perf_counter()
        self.proc.stdin.write(f"{port}\n")
        self.proc.stdin.flush()
        self._wait_for(("first", port))
        if wait == "all":
            self._wait_for(("done", port))
        return time.perf_counter() - start

    def release(self) -> None:
        """Wait for the crowds still arriving, then close every stranger's connection."""
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()
        self._wait_for(("closed", None))
        with self.cond:
            self.events.clear()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_case(client, X, y, params, attacker, wait):
    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.engines import channel

    connect = channel.connect
    waited, connects = [], []

    def hooked(address, *args, **kwargs):
        if attacker is not None:
            waited.append(attacker.crowd(int(address[1]), wait))
        start = time.perf_counter()
        try:
            return connect(address, *args, **kwargs)
        finally:
            connects.append(time.perf_counter() - start)

    channel.connect = hooked
    start = time.perf_counter()
    try:
        clf = MWUMKLClassifier(**params, engine="dask", client=client, n_shards=2).fit(X, y)
    finally:
        total = time.perf_counter() - start
        channel.connect = connect
        if attacker is not None:
            attacker.release()
    return clf, {"fit_s": total, "attacker_wait_s": sum(waited), "connect_max_s": max(connects, default=0.0)}


def same_model(a, b) -> bool:
    return all(
        np.array_equal(getattr(a, k), getattr(b, k))
        for k in ("dual_coef_", "support_", "kernel_weights_", "intercept_")
    )


def bench(security: str, args) -> dict:
    import distributed

    from mwumkl_dist import MWUMKLClassifier

    X, y = _problem(args.n, args.d)
    params = dict(kernels="paper", C=100.0, epsilon=0.2, polish=False, selectivity="paper")
    ref = MWUMKLClassifier(**params).fit(X, y)
    kwargs = dict(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client_kwargs = {}
    if security == "tls":
        sec = distributed.security.Security.temporary()
        kwargs.update(protocol="tls://", security=sec)
        client_kwargs["security"] = sec
    else:
        kwargs.update(protocol="tcp://", host="127.0.0.1")
    attacker = Attacker(args.crowd)
    rows = {"none": [], "crowd": []}
    identical = {"none": True, "crowd": True}
    try:
        with distributed.LocalCluster(**kwargs) as cluster, distributed.Client(cluster, **client_kwargs) as client:
            run_case(client, X, y, params, None, args.wait)  # warm-up: the workers import and compile
            for _ in range(args.repeats):
                for case in ("none", "crowd"):
                    clf, row = run_case(client, X, y, params, attacker if case == "crowd" else None, args.wait)
                    identical[case] &= same_model(clf, ref)
                    row["fit_without_wait_s"] = row["fit_s"] - row["attacker_wait_s"]
                    rows[case].append(row)
                    print(security, case, {k: round(v, 3) for k, v in row.items()}, flush=True)
    finally:
        attacker.stop()
    out = {}
    for case, values in rows.items():
        out[case] = {k: statistics.median(r[k] for r in values) for k in values[0]}
        out[case]["identical_to_local"] = identical[case]
        out[case]["runs"] = values
    out["extra_s"] = out["crowd"]["fit_s"] - out["none"]["fit_s"]
    out["extra_without_wait_s"] = out["crowd"]["fit_without_wait_s"] - out["none"]["fit_without_wait_s"]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--security", choices=["plain", "tls", "both"], default="both")
    parser.add_argument("--crowd", type=int, default=1000, help="silent and garbage strangers each, per shard port")
    parser.add_argument("--wait", choices=["all", "100"], default="all",
                        help="the driver connects once the whole crowd (or its first 100) is in")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n", type=int, default=400, help="training rows")
    parser.add_argument("--d", type=int, default=5, help="features")
    parser.add_argument("--fd-limit", type=int, default=None, help="the workers' soft limit on open files")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default benchmarks/results; smoke: a "
                        "temporary one)")  # fmt: skip
    parser.add_argument("--smoke", action="store_true",
                        help="plain only, a crowd of 10, one repeat, 120 rows: checks the script")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        import tempfile

        args.security, args.crowd, args.repeats, args.n = "plain", 10, 1, 120
        args.out = args.out or Path(tempfile.mkdtemp(prefix="bench-smoke-"))
    args.out = args.out or HERE / "results"
    if args.fd_limit is not None:  # the worker processes inherit it (the attacker raises its own)
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (args.fd_limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    kinds = ["plain", "tls"] if args.security == "both" else [args.security]
    results = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg(),
        },  # fmt: skip
        "results": {kind: bench(kind, args) for kind in kinds},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = ("" if args.wait == "all" else f"_wait{args.wait}") + (
        "" if args.fd_limit is None else f"_fd{args.fd_limit}"
    )
    (args.out / f"flood{suffix}.json").write_text(json.dumps(results, indent=1))
    lines = [
        f"# Start-up flood: {args.crowd} silent + {args.crowd} garbage connections per shard port",
        "",
        f"`python benchmarks/bench_flood.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
        f"process LocalCluster, 2 workers x 1 thread, n_shards=2, {args.n} rows; driver waits for: {args.wait}; "
        f"median of {args.repeats}; worker fd limit: {args.fd_limit or 'inherited'}.",
        "",
        "| security | case | fit s | waiting for the attacker s | fit without that wait s | slowest connect s |"
        " same model |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, res in results["results"].items():
        for case in ("none", "crowd"):
            r = res[case]
            lines.append(
                f"| {kind} | {case} | {r['fit_s']:.2f} | {r['attacker_wait_s']:.2f} | {r['fit_without_wait_s']:.2f} "
                f"| {r['connect_max_s']:.3f} | {'yes' if r['identical_to_local'] else 'NO'} |"
            )
        lines.append(f"| {kind} | extra | {res['extra_s']:+.2f} | | {res['extra_without_wait_s']:+.2f} | | |")
    (args.out / f"flood{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
