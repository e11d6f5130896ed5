"""One process of the off-policy options' learner job (tests/train/test_multihost_offpolicy.py): 1 process × 8
devices or 2 × 4, mesh (data=2, fsdp=2, tensor=2), the processes agreeing on every update's plan through the
coordination channel as the trainer's do.

    vtrace_gate  V-trace critic targets and the explained-variance actor start, the one-call update, 3 updates
    grouped      V-trace critic targets in the length-grouped update, 2 updates

Each process writes `<out>/<processes>-p<process>.npz`: metrics, traced targets and the plans it agreed on.
"""
import argparse
import json
import os

from tests.multihost import initialize_from_env

PROCESS = initialize_from_env()

import jax  # noqa: E402  (after the distributed runtime is up)
import numpy as np  # noqa: E402

from sao.train import coordination  # noqa: E402
from sao.train import mesh as mesh_lib  # noqa: E402
from tests.train import helpers  # noqa: E402

jax.config.update("jax_threefry_partitionable", True)

SHAPE = {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}
VTRACE = {"sao.critic_target_correction": "vtrace", "sao.lambda_critic": 0.9, "sao.vtrace_c_bar": 0.8}
# EV of this toy's untrained critic is below any useful bar: threshold −10 opens the gate on the first full window
# (update 1), the cap (5) is never reached.
GATE = {"sao.actor_start": "critic_ev", "sao.actor_start_ev_threshold": -10.0, "sao.actor_start_ev_window": 1,
        "sao.actor_start_max_steps": 5}
RUNS = {"vtrace_gate": ({**VTRACE, **GATE}, 3), "grouped": ({**VTRACE, "batching.length_groups": 2,
                                                             "sao.critic_warmup_steps": 0}, 2)}


def _config(**overrides):
  c = helpers.learner_config(**{"actor.optimizer.eps": 1.0, "critic.optimizer.eps": 1.0, **overrides})
  c.mesh.update(SHAPE)
  return c


def main(out: str) -> None:
  channel = coordination.create(heartbeat_timeout_s=30.0)
  record = {}
  for name, (overrides, updates) in RUNS.items():
    learner = helpers.make_learner(_config(**overrides), mesh=mesh_lib.make_mesh(SHAPE))
    plans = []
    if jax.process_count() > 1:
      learner.agree = lambda tag, plan: (plans.append(plan), channel.agree(tag, plan))[1]
    for update in range(updates):
      metrics, traces = learner.update_traced(helpers.trajectories(seed=200 + update, n=7, min_len=4, max_len=30),
                                              rows=[0, 3, 6])
      record[f"{name}_metrics{update}"] = np.asarray(json.dumps(metrics, sort_keys=True))
      record[f"{name}_returns{update}"] = traces["returns"]
    record[f"{name}_plans"] = np.asarray(json.dumps([{k: v for k, v in p.items() if k != "previous_update_programs"}
                                                     for p in plans], sort_keys=True))
    record[f"{name}_version"] = np.asarray(learner.version)
  channel.close()
  np.savez(os.path.join(out, f"{jax.process_count()}-p{PROCESS}.npz"), **record)


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  main(parser.parse_args().out)
  print(f"process {PROCESS}: done", flush=True)
