r"""The off-policy and mismatch options of issue 48 as one-factor arms of the stabilized SAO toy recipe on number
search (`sao_openswe.py:toy`), 3 seeds per arm, plus a stress setting that provokes mismatch — twice the samples
outstanding (4 batches instead of 2: staleness ≈ 3 instead of ≈ 1) and 3× the actor's learning rate — with and
without each correction.

Arms (each changes one thing from its reference; `FACTORS` names the config keys, docs/algorithm.md the options):
  tis, icepop          the actor loss (vs DIS)                         `learner.actor_loss`
  vtrace               V-trace critic targets (vs λ-returns)           `learner.sao.critic_target_correction`
  ev_gate              actor start when critic EV ≥ 0.3 over 5 updates `learner.sao.actor_start`
  adaptive_staleness   max_outstanding follows the log-prob mismatch   `server.adaptive_staleness.enabled`
  stress               max_outstanding 4 batches (vs 2), actor LR 1.2e-3 (vs 4e-4)
  stress_<option>      the stress setting with one option on (read against `stress`)
Routing replay (option e) needs a MoE policy; the toy's is dense, so its arm lives with the MoE runs.

    python -m launch.local --sweep=launch/sweeps/toy_offpolicy.py --workdir=/tmp/toy_offpolicy --max_parallel=2
    python experiments/paper/trim.py --sweep=toy_offpolicy --workdir=/tmp/toy_offpolicy   # --evaluate: re-measure
    python experiments/reproduce.py --sweep=toy_offpolicy

The committed runs (`experiments/paper/runs/toy_offpolicy/`, docs/results_critic.md) ran two at a time, not re-measured.
"""
from launch import sweep as s

SEEDS = (0, 1, 2)
CONFIG = "experiments/configs/sao_openswe.py:toy"
REFERENCE = "stabilized"

OPTIONS = {
    "tis": ("truncated IS actor loss (C = 2) instead of DIS", {"learner.actor_loss": "tis"}),
    "icepop": ("IcePop masked actor loss ([0.5, 5]) instead of DIS", {"learner.actor_loss": "icepop"}),
    "vtrace": ("V-trace critic targets (ρ̄ = c̄ = 1)", {"learner.sao.critic_target_correction": "vtrace"}),
    "ev_gate": ("actor start gated on critic EV (0.3 over 5 updates, cap 100) instead of the fixed warm-up",
                {"learner.sao.actor_start": "critic_ev"}),
    "adaptive_staleness": ("max_outstanding follows the log-prob mismatch",
                           {"server.adaptive_staleness.enabled": True}),
}
STRESS = {"server.max_outstanding": 256, "learner.actor.optimizer.learning_rate": 1.2e-3}

# arm -> (what changes, the overrides that change it)
FACTORS = {
    **OPTIONS,
    "stress": ("stress: max_outstanding 4 batches (vs 2), actor LR 1.2e-3 (vs 4e-4)", STRESS),
    **{f"stress_{arm}": (f"stress + {what}", {**STRESS, **overrides}) for arm, (what, overrides) in OPTIONS.items()},
}

ANALYSIS = {
    "kind": "ablations",
    "reference": REFERENCE,
    "factors": {arm: what for arm, (what, _) in FACTORS.items()},
    "also_against": {"stress": tuple(f"stress_{arm}" for arm in OPTIONS)},
    "threshold_pct": 60.0,
}


def get_sweep() -> list[s.Run]:
  return s.ablation_runs(REFERENCE, CONFIG, SEEDS, FACTORS, by_seed=True)
