"""One process of a learner job run by `tests.multihost.run_processes` (1 process × 8 devices, or 2 × 4): the checks
of tests/train/test_multihost_learner.py, several per job because process start-up and compilation dominate.

    run     SAO on mesh (data=2, fsdp=2, tensor=2): `UPDATES` updates (critic epochs, whitening, DIS, a padding row,
            traced rows), a checkpoint after update `CHECKPOINT_AT`, the critic saved and reloaded; one GSPO update;
            one SAO update on a mesh whose batch axis does not span processes (tensor does), with policy exports
            before and after it. With `--kill`, every process SIGKILLs itself at the end (nothing may depend on a
            clean shutdown).
    resume  a fresh SAO learner restores the checkpoint and runs the remaining updates.

Each process writes `<out>/<mode>-p<process>.npz`: state leaves, metrics, traces — values every process must agree on.
"""
import argparse
import json
import os
import signal
import sys

from tests.multihost import initialize_from_env

PROCESS = initialize_from_env()

import jax  # noqa: E402  (after the distributed runtime is up)
import numpy as np  # noqa: E402

from sao.train import distributed  # noqa: E402
from sao.train import mesh as mesh_lib  # noqa: E402
from sao.train import checkpoint as ckpt_lib  # noqa: E402
from sao.train.checkpoint import Checkpointer  # noqa: E402
from sao.train.export import export_policy  # noqa: E402
from tests.train import helpers  # noqa: E402

jax.config.update("jax_threefry_partitionable", True)

UPDATES, CHECKPOINT_AT = 4, 2
SHAPE = {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}


def _config(**overrides):
  # Adam eps = 1 (tests/train/test_learner.py `_smooth_adam_config`): params inherit the gradients' float32 rounding
  # scaled down by lr, so a different cross-process reduction order cannot move a near-zero-gradient param by ~lr.
  c = helpers.learner_config(**{"actor.optimizer.eps": 1.0, "critic.optimizer.eps": 1.0,
                                "sao.critic_warmup_steps": 1, **overrides})
  c.mesh.update(SHAPE)
  return c


def _stream(update: int):
  return helpers.trajectories(seed=100 + update, n=7)  # 7 trajectories → 8 rows: one padding row


def _state(learner) -> list[np.ndarray]:
  roles = [learner.actor.state] + ([learner.critic.state] if learner.critic is not None else [])
  return [np.asarray(x) for x in jax.tree.leaves(distributed.fetch(roles))] + [np.asarray(jax.device_get(learner.rng))]


def _sao_updates(learner, start: int, record: dict, checkpointer=None) -> None:
  for update in range(start, UPDATES):
    metrics, traces = learner.update_traced(_stream(update), rows=[0, 6, 7])
    record[f"metrics{update}"] = np.asarray(json.dumps(metrics, sort_keys=True))
    for k, v in traces.items():
      record[f"trace{update}_{k}"] = v
    if checkpointer is not None and learner.num_updates == CHECKPOINT_AT:
      assert learner.save_checkpoint(checkpointer, extra={"dispenser": {"next_task": 11}})
      checkpointer.wait()


def run(out: str, kill: bool) -> None:
  mesh = mesh_lib.make_mesh(SHAPE)
  record = {}
  # The batch axis spans the processes: data index 0 lives on process 0's devices, 1 on process 1's.
  learner = helpers.make_learner(_config(), mesh=mesh)
  checkpointer = Checkpointer(os.path.join(out, f"ckpt{jax.process_count()}"), every=1, max_to_keep=5)
  _sao_updates(learner, 0, record, checkpointer)
  record.update({f"sao_{i}": x for i, x in enumerate(_state(learner))})
  record["counters"] = np.asarray([learner.num_updates, learner.version])
  critic_dir = os.path.join(out, f"critic{jax.process_count()}")
  learner.save_critic(critic_dir)  # value pretraining's hand-over, by every process
  loaded = ckpt_lib.load_params(critic_dir, learner.critic.sharded_abstract_params())
  record["critic_reloaded"] = np.asarray(helpers.tree_equal(distributed.fetch(loaded),
                                                            distributed.fetch(learner.critic_params)))

  gspo = helpers.make_learner(_config(algorithm="gspo"), mesh=mesh)
  record["gspo_metrics"] = np.asarray(json.dumps(gspo.update(helpers.trajectories(seed=7, n=8)), sort_keys=True))
  record.update({f"gspo_{i}": x for i, x in enumerate(_state(gspo))})

  # Devices interleaved over processes: each fsdp shard of the batch sits on one device of each process, so every
  # process holds the whole batch (the batch axis does not span processes; tensor does).
  devices = jax.devices()
  interleaved = [devices[i // 2 + (i % 2) * 4] for i in range(8)]
  shape = {"data": 1, "fsdp": 4, "expert": 1, "tensor": 2}
  config = _config(**{"sao.critic_warmup_steps": 0})
  config.mesh.update(shape)
  across = helpers.make_learner(config, mesh=mesh_lib.make_mesh(shape, interleaved))
  # Exports of params split over the processes (tensor-sharded): the initial ones (the same in every job) and the
  # trained ones.
  export_policy(helpers.model_config(), across.actor_params, None, os.path.join(out, f"export{jax.process_count()}"))
  record["across_metrics"] = np.asarray(json.dumps(across.update(_stream(0)), sort_keys=True))
  record.update({f"across_{i}": x for i, x in enumerate(_state(across))})
  export_policy(helpers.model_config(), across.actor_params, None, os.path.join(out, f"trained{jax.process_count()}"))
  record.update({f"host_{i}": x for i, x in enumerate(jax.tree.leaves(across.actor_params_on_host()))})

  np.savez(os.path.join(out, f"run{jax.process_count()}-p{PROCESS}.npz"), **record)
  if kill:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
  checkpointer.close()


def resume(out: str) -> None:
  learner = helpers.make_learner(_config(), mesh=mesh_lib.make_mesh(SHAPE))
  checkpointer = Checkpointer(os.path.join(out, f"ckpt{jax.process_count()}"), every=1, max_to_keep=5)
  extra = learner.restore_checkpoint(checkpointer, step=CHECKPOINT_AT)
  record = {"extra": np.asarray(json.dumps(extra))}
  _sao_updates(learner, CHECKPOINT_AT, record)
  record.update({f"sao_{i}": x for i, x in enumerate(_state(learner))})
  record["counters"] = np.asarray([learner.num_updates, learner.version])
  checkpointer.close()
  np.savez(os.path.join(out, f"resume{jax.process_count()}-p{PROCESS}.npz"), **record)


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("mode", choices=("run", "resume"))
  parser.add_argument("--out", required=True)
  parser.add_argument("--kill", action="store_true")
  args = parser.parse_args()
  if args.mode == "run":
    run(args.out, args.kill)
  else:
    resume(args.out)
  print(f"process {PROCESS}: {args.mode} done", flush=True)
