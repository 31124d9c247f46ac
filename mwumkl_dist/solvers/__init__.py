"""Solvers: the MWU solver, the two-stage solver, the automatic choices and calibration, and the fit driver."""
