"""Evaluation: labelled datasets, the runner, per-layer metrics, the evidence trace, calibration and
external yardsticks."""
