"""Launching experiments: sweeps (grids over configs and seeds), the local sweep runner, TPU-pod + SGLang fleets."""
