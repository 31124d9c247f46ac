"""Two-stage MKL for large ``n``: the kernel weights from a subsample, the classifier from all rows.

The MWU solver needs ``T ~ n / 5`` iterations for an accurate classifier on
noisy data (``O(m n^2)`` time), but far fewer to find the kernel weights.  The
two-stage fit (``solver="two-stage"``) therefore

1. learns the kernel weights ``mu`` (and ``C``, the selectivity) with the MWU fit
   path on a stratified subsample of up to 3000 rows
   (:func:`weight_points_for`: small enough for the exact polish, so
   ``epsilon = 0.2``; ``C="auto"`` and ``selectivity="auto"`` cross-validate on
   it as usual);
2. maps every row to Nystroem features of the learned combined kernel
   ``K = sum_i mu_i K_i / (r_i / n)`` (unit mean diagonal) on landmark rows
   ``L``: ``phi(x) = K(x, L) M`` with ``M = U S^{-1/2}`` from ``K(L, L) = U S U'``
   (so ``phi(x)' phi(z)`` is the Nystroem approximation of ``K(x, z)``, exact
   when ``L`` holds all rows).  The rank adapts (:meth:`TwoStageSolver._grow_stage`):
   :data:`N_COMPONENTS` landmarks from one fixed random order, doubled (the sets
   nested) while the held-out error of the final check of ``C`` falls by more than its
   standard error, and the Nystroem residual on rows that are not landmarks
   (:func:`nystroem_residual`) is above :data:`RESIDUAL_TOL`, up to
   :func:`rank_budget` and what ``memory_limit`` affords (:mod:`.budget`);
3. solves the same 2-norm soft-margin SVM the MWU approximates (squared hinge,
   ``C`` per point as the MWU's ridge ``1 / C``) on those features with a
   finite Newton method (:func:`newton_solve`) whose Hessian is updated by the
   rows that change sides, started from the smallest map's solution.  The
   shards keep the kernel columns ``K(x, L)`` and project them as they go.

The linear model ``w' phi(x) + b`` is a kernel expansion on the landmarks,
``sum_l beta_l K(x, L_l) + b`` with ``beta = M w``: the fitted model has the
estimator's usual attributes (``support_`` = the landmarks, ``dual_coef_`` =
``beta``, ``raw_kernel_weights_``), so prediction, persistence and inspection
work unchanged.  Cost: ``O(m s^2)`` for the weights (``s`` fixed), ``O(m' n r)``
for the kernel columns (``m'`` kernels with non-negligible weight, ``r``
landmarks), ``O(n_A r^2)`` for the first Hessian (``n_A`` rows on the margin
or inside it) and ``O(r^3)`` per Newton step: linear in ``n`` once the rank
stops growing."""

from mwumkl_dist.solvers.two_stage import budget, newton, nystroem, shards, solver, spill
from mwumkl_dist.solvers.two_stage.budget import *  # noqa: F403
from mwumkl_dist.solvers.two_stage.newton import *  # noqa: F403
from mwumkl_dist.solvers.two_stage.nystroem import *  # noqa: F403
from mwumkl_dist.solvers.two_stage.shards import *  # noqa: F403
from mwumkl_dist.solvers.two_stage.solver import *  # noqa: F403
from mwumkl_dist.solvers.two_stage.spill import *  # noqa: F403

__all__ = [*budget.__all__, *nystroem.__all__, *spill.__all__, *shards.__all__, *newton.__all__, *solver.__all__]
