"""Distributed quick start: the same fit on a Dask cluster.

Part 1 starts a local Dask cluster of 2 worker processes and fits with
``engine="dask"``: each of the 2 row shards lives on a worker for the whole fit.
Part 2 runs the same code given only a scheduler address, which is how you use
a remote cluster.  The address comes from the command line or from
``$DASK_SCHEDULER_ADDRESS``; without one, part 2 addresses part 1's cluster by
its scheduler address, so the example runs as is (in about 30 s on a 2-core box).

    python examples/distributed_quickstart.py                         # both parts here
    python examples/distributed_quickstart.py tcp://scheduler:8786    # part 2 on your cluster

A remote cluster's workers need the same mwumkl_dist and dask versions as this
machine, and this machine must reach the workers on any TCP port (each shard
answers on a direct connection); see deploy/README.md.  Both fits end with the
same model as the local engine: the sharding does not change the result.
"""

import asyncio
import os
import sys
import time

import numpy as np
from distributed import Client, LocalCluster
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import MinMaxScaler

from mwumkl_dist import MWUMKLClassifier

PARAMS = dict(kernels="paper", epsilon=0.2, C=100.0)


def load():
    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
    scaler = MinMaxScaler().fit(X_train)
    return scaler.transform(X_train), scaler.transform(X_test), y_train, y_test


def report(title, clf, seconds, X_test, y_test, reference):
    print(f"\n== {title}")
    print(f"fit time        {seconds:.2f} s ({clf.n_iter_} iterations)")
    print(f"test error      {np.mean(clf.predict(X_test) != y_test):.2%}")
    print("kernel weights  " + "  ".join(f"{w:.4f}" for w in clf.kernel_weights_))
    diff = np.max(np.abs(clf.kernel_weights_ - reference.kernel_weights_))
    print(
        f"vs local engine max |weight difference| {diff:.3g}, same support: "
        f"{np.array_equal(clf.support_, reference.support_)}"
    )


def main(argv):
    address = argv[1] if len(argv) > 1 else os.environ.get("DASK_SCHEDULER_ADDRESS")
    X_train, X_test, y_train, y_test = load()
    reference = MWUMKLClassifier(**PARAMS).fit(X_train, y_train)  # the local engine, to compare
    print("kernels         " + ", ".join(reference.kernel_names_))

    # Part 1: a local cluster of 2 worker processes (1 thread each), through a Client.
    # dashboard_address=":0": the scheduler always serves HTTP; on a free port, not the often taken 8787.
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            start = time.perf_counter()
            clf = MWUMKLClassifier(engine="dask", client=client, n_shards=2, **PARAMS).fit(X_train, y_train)
            report(
                "part 1: LocalCluster, 2 worker processes, 2 row shards",
                clf,
                time.perf_counter() - start,
                X_test,
                y_test,
                reference,
            )

        if address is None:
            print(
                "\nno scheduler address given (argument or $DASK_SCHEDULER_ADDRESS): part 2 uses the "
                f"local cluster's scheduler, {cluster.scheduler_address}"
            )
            part2(cluster.scheduler_address, X_train, X_test, y_train, y_test, reference)
        close_workers(cluster)
    if address is not None:
        part2(address, X_train, X_test, y_train, y_test, reference)
    return 0


def close_workers(cluster, timeout=60.0):
    """Stop the workers, giving each process ``timeout`` seconds to exit.

    Leaving it to the cluster's close gives a worker process 4 seconds, after which its nanny kills it
    ("Worker process still alive after 4.0 seconds, killing"): a worker that ran fits (numba's kernels
    loaded) took about 5 s to exit on a busy 2-core machine.
    """
    nannies = list(cluster.workers.values())
    cluster.sync(lambda: asyncio.gather(*(nanny.close(timeout=timeout) for nanny in nannies)))


def part2(address, X_train, X_test, y_train, y_test, reference):
    # Part 2: only an address.  The estimator connects (giving up with a clear
    # error after scheduler_timeout seconds) and disconnects when the fit ends.
    start = time.perf_counter()
    clf = MWUMKLClassifier(engine="dask", client=address, n_shards=2, scheduler_timeout=10.0, **PARAMS)
    clf.fit(X_train, y_train)
    report(f"part 2: scheduler at {address}, 2 row shards", clf, time.perf_counter() - start, X_test, y_test, reference)


if __name__ == "__main__":  # required: the worker processes re-import this file
    sys.exit(main(sys.argv))
