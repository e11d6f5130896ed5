r"""The off-policy and mismatch options of issue 48 (`toy_offpolicy`'s arms) on `search_chain`, the task where the
critic matters (`sao_search_chain.py:toy`): one-factor arms of its SAO recipe, 3 seeds each, plus a stress setting
that provokes mismatch — twice the samples outstanding (4 batches of 32 instead of 2) and 3× the actor's learning
rate — with and without each correction.

The reference arm is `toy_critic_matters`' `sao` (same config, same run names): run both sweeps into one workdir
from one checkout and its three runs are trained once.

    python -m launch.local --sweep=launch/sweeps/toy_chain_offpolicy.py --workdir=/tmp/toy_chain --max_parallel=2
    python experiments/paper/trim.py --sweep=toy_chain_offpolicy --workdir=/tmp/toy_chain
    python experiments/reproduce.py --sweep=toy_chain_offpolicy
"""
import importlib.util
import os

from launch import sweep as s

SEEDS = (0, 1, 2)
CONFIG = "experiments/configs/sao_search_chain.py:toy"
REFERENCE = "sao"


def _offpolicy_options() -> dict:
  """`toy_offpolicy.OPTIONS` (arm → (what changes, overrides)), the same options on both tasks."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_offpolicy.py")
  spec = importlib.util.spec_from_file_location("_toy_offpolicy_options", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.OPTIONS


OPTIONS = _offpolicy_options()
STRESS = {"server.max_outstanding": 128, "learner.actor.optimizer.learning_rate": 6e-4}

# arm -> (what changes, the overrides that change it)
FACTORS = {
    **OPTIONS,
    "stress": ("stress: max_outstanding 4 batches (vs 2), actor LR 6e-4 (vs 2e-4)", STRESS),
    **{f"stress_{arm}": (f"stress + {what}", {**STRESS, **overrides}) for arm, (what, overrides) in OPTIONS.items()},
}

ANALYSIS = {
    "kind": "ablations",
    "reference": REFERENCE,
    "factors": {arm: what for arm, (what, _) in FACTORS.items()},
    "also_against": {"stress": tuple(f"stress_{arm}" for arm in OPTIONS)},
    "threshold_pct": 50.0,
}


def get_sweep() -> list[s.Run]:
  return s.ablation_runs(REFERENCE, CONFIG, SEEDS, FACTORS, by_seed=True)
