r"""The simulated fleet (`experiments/simulate_fleet.py`, `sao.simulation`): SAO and GSPO at 64 / 512 / 4,096 agent
loops, with the service knobs the `full` configs ship and with flow control scaled to the fleet.

    python experiments/simulate_fleet.py --config=experiments/configs/simulation/fleet_sim.py:full \
        --out_dir=/tmp/fleet_sim
    python experiments/simulate_fleet.py --config=experiments/configs/simulation/fleet_sim.py:quick  # a smoke run

Where the numbers come from (docs/fleet_simulation.md discusses each):
- Trainer step times: the compile report's XLA cost-model estimates for the `full` configs on a v5p-128 (the `02552e5`
  report, docs/history.md, 2026-11-30; T = 32,768). No train-step program fits there, so a step is taken as 3 forwards
  of its shape (forward + backward, the 6N vs 2N FLOP rule): SAO = 2 critic forwards (12.49 s each) + 2 critic steps (3
  × 12.49 s) + 1 DIS actor step (3 × 12.67 s) ≈ 138 s for 64 trajectories; GSPO = 1 actor step on 512 trajectories (3 ×
  101.4 s) ≈ 304 s. At the 3 % MFU those estimates imply; `sao.step_s=...` / `gspo.step_s=...` to change. The recipe's
  SAO update (λ_critic = 1, no value clip) runs one critic forward, not two (no V⁰ before the critic's epochs), ≈ 125.5
  s: the runs recorded in docs/fleet_simulation.md kept 138 s (`--config.sao.step_s=125.5` for the recipe's).
- Turns: log-normal around 40 (σ 0.5), clipped to [1, 100]: the write-up's stabilized SAO run averaged 49.1
  assistant turns (109.5 for the initial recipe under a 200-turn cap; `experiments/paper/reported.py`, RECIPE).
- Per-turn generation (log-normal, median 5 s) and tool time (log-normal, median 2 s, σ 1.2: a few test runs take
  minutes), container setup (median 30 s), 512 engine slots at full speed: assumptions, not measurements (flags).
- Service knobs as `common.full_scale` ships them: max_staleness 8, lease TTL 2 h, buffer 512 (SAO) / 1,024 (GSPO),
  max_outstanding = 2 × batch (`common.finalize`); `scaled` flow control lets every loop run (max_outstanding =
  max(2 × batch, loops)).
- Targets: the write-up's trajectories to each method's best checkpoint (SAO 12,800, GSPO 48,600; SAMPLING).
"""
import ml_collections

from experiments.configs import common

VARIANTS = ("full", "quick")


def get_config(arg: str | None = None):
  variant, overrides = common.parse_arg(arg, VARIANTS, default="full")
  config = ml_collections.ConfigDict(dict(
      name=f"fleet_sim_{variant}",
      seed=0,
      loops=(64, 512, 4096),
      algorithms=("sao", "gspo"),
      # shipped: max_outstanding = 2 × batch; scaled: max(2 × batch, loops); "<k>x": k × batch.
      flow_control=("shipped", "scaled"),
      sao=dict(group_size=1, batch_size=64, step_s=138.0, buffer_capacity=512, target_trajectories=12_800),
      gspo=dict(group_size=8, batch_size=512, step_s=304.0, buffer_capacity=1024, target_trajectories=48_600),
      episode=dict(setup_s="lognormal:30,0.5", turns="lognormal:40,0.5,1,100", gen_s="lognormal:5,0.7",
                   tool_s="lognormal:2,1.2,0,900"),
      engine_slots=512,
      publish_s=0.0,
      max_staleness=8,
      lease_ttl_s=7200.0,
      backpressure_retry_s=0.2,
      no_work_retry_s=1.0,
      num_tasks=10_000,
      max_hours=72.0,
  ))
  if variant == "quick":
    config.loops = (16, 64)
    config.flow_control = ("shipped",)
    config.sao.target_trajectories = 256
    config.gspo.target_trajectories = 1024
  common.apply_overrides(config, overrides)
  config.lock()
  return config
