"""Configs of simulations (not training runs: `tests/experiments/test_configs.py` checks those one level up)."""
