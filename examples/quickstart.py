"""Quick start: learn a kernel combination and a classifier on one machine.

Run it as is (a few seconds after the first run; the first run compiles the
numba kernels):

    python examples/quickstart.py
"""

import os
import tempfile

import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import MinMaxScaler

from mwumkl_dist import MWUMKLClassifier

X, y = load_breast_cancer(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
scaler = MinMaxScaler().fit(X_train)  # scale with the training part only
X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)

# The paper's 12 kernels: polynomials of degree 1-3 and 9 Gaussians, all on every feature.
# C, epsilon and the exact polish are chosen automatically (C by cross-validation on the training part).
clf = MWUMKLClassifier(kernels="paper")
clf.fit(X_train, y_train)

print(f"chosen C        {clf.C_:g} (relative to n), epsilon {clf.epsilon_:g}, polished {clf.polished_}")
print(f"iterations      {clf.n_iter_}")
print(f"test error      {np.mean(clf.predict(X_test) != y_test):.2%}")
print(f"support vectors {len(clf.support_)} of {len(y_train)}")
print("kernel weights:")
for name, weight in zip(clf.kernel_names_, clf.kernel_weights_):
    print(f"  {name:<28} {weight:.6f}")

# A fitted model saves to one .npz file and loads back without pickle.
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model.npz")
    clf.save(path)
    again = MWUMKLClassifier.load(path)
assert np.array_equal(again.predict(X_test), clf.predict(X_test))
print("saved and loaded back: same predictions")
