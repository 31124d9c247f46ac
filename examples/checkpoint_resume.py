"""Checkpoint and resume: a fit that crashes half-way ends with the same model.

The fit writes its driver state (iteration, ``s``, the picks so far) every
``checkpoint_every`` iterations.  Here a callback raises at iteration 650 to
simulate a crash (a killed driver, a lost node); ``fit(..., resume=path)`` then
rebuilds the shards from the data and the recorded picks, continues from the
last checkpoint (iteration 600) and gives exactly the model of a fit that never
stopped.

    python examples/checkpoint_resume.py          # local engine
    python examples/checkpoint_resume.py --dask   # engine="dask" (local threaded Dask cluster)
"""

import os
import sys
import tempfile

import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.preprocessing import MinMaxScaler

from mwumkl_dist import MWUMKLClassifier

CRASH_AT = 650


class SimulatedCrash(RuntimeError):
    """Stands for whatever kills a real fit."""


def crash_at(iteration):
    def callback(info):  # called every callback_every iterations
        if info.iteration >= iteration:
            raise SimulatedCrash(f"simulated crash at iteration {info.iteration} of {info.n_iter}")

    return callback


def main(argv):
    engine = dict(engine="dask", n_shards=2) if "--dask" in argv[1:] else dict(engine="local")
    X, y = load_breast_cancer(return_X_y=True)
    X = MinMaxScaler().fit_transform(X)
    params = dict(kernels="paper", epsilon=0.1, C=100.0, **engine)  # epsilon 0.1: about 1300 iterations

    reference = MWUMKLClassifier(**params).fit(X, y)
    print(f"uninterrupted fit ({params['engine']} engine): {reference.n_iter_} iterations")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "checkpoint.npz")
        crashing = MWUMKLClassifier(
            **params, checkpoint=path, checkpoint_every=100, callback=crash_at(CRASH_AT), callback_every=50
        )
        try:
            crashing.fit(X, y)
            raise AssertionError("the fit should have crashed")
        except SimulatedCrash as exc:
            print(
                f"first attempt: {exc}; checkpoint {os.path.basename(path)} "
                f"({os.path.getsize(path)} bytes) holds iteration {CRASH_AT // 100 * 100}"
            )

        resumed = MWUMKLClassifier(**params, checkpoint=path, checkpoint_every=100).fit(X, y, resume=path)

    same = {
        "kernel weights": np.array_equal(resumed.kernel_weights_, reference.kernel_weights_),
        "support vectors": np.array_equal(resumed.support_, reference.support_),
        "dual coefficients": np.array_equal(resumed.dual_coef_, reference.dual_coef_),
        "bias": np.array_equal(resumed.intercept_, reference.intercept_),
        "predictions": np.array_equal(resumed.predict(X), reference.predict(X)),
    }
    print(f"resumed fit: {resumed.n_iter_} iterations")
    for what, equal in same.items():
        print(f"  {what:<18} {'identical' if equal else 'DIFFERENT'} to the uninterrupted fit")
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
