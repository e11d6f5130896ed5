"""Checkpoints: resume in a fresh process is bit-exact; an unreadable newest step is skipped; the checkpointer stores
plain pytrees + JSON and never sees a learner."""
import ast
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from sao.train.checkpoint import Checkpointer
from tests.train import helpers

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Run in a subprocess: restore the checkpoint into a fresh learner, train `n` more updates, save all params.
_RESUME = """
import os, sys
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
import jax, numpy as np
jax.config.update("jax_threefry_partitionable", True)
from sao.train.checkpoint import Checkpointer
from tests.train import helpers
ckpt_dir, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
learner = helpers.make_learner(**{"sao.critic_warmup_steps": 1})
checkpointer = Checkpointer(ckpt_dir)
extra = learner.restore_checkpoint(checkpointer)
for i in range(n):
  learner.update(helpers.trajectories(seed=learner.num_updates))
leaves = jax.tree.leaves(jax.device_get((learner.actor.state, learner.critic.state, learner.rng)))
np.savez(out, *leaves, extra=np.asarray(repr(extra)), counters=np.asarray([learner.num_updates, learner.version]))
"""


def _leaves(learner):
  return jax.tree.leaves(jax.device_get((learner.actor.state, learner.critic.state, learner.rng)))


def test_resume_in_fresh_process_is_bit_exact_and_truncated_step_is_skipped(tmp_path):
  total, cut = 3, 1
  straight = helpers.make_learner(**{"sao.critic_warmup_steps": 1})
  for _ in range(total):
    straight.update(helpers.trajectories(seed=straight.num_updates))
  expected = _leaves(straight)

  learner = helpers.make_learner(**{"sao.critic_warmup_steps": 1})
  checkpointer = Checkpointer(str(tmp_path / "ckpt"), every=1, max_to_keep=3)
  for _ in range(cut):
    learner.update(helpers.trajectories(seed=learner.num_updates))
  assert learner.save_checkpoint(checkpointer, extra={"dispenser": {"next_task": 7}}, only_if_due=True)
  # One more step saved and then damaged, as if the process died while writing it.
  learner.update(helpers.trajectories(seed=learner.num_updates))
  learner.save_checkpoint(checkpointer, extra={"dispenser": {"next_task": 9}})
  checkpointer.wait()
  assert checkpointer.all_steps() == [cut, cut + 1]
  damaged = tmp_path / "ckpt" / str(cut + 1) / "actor"
  for root, _, files in os.walk(damaged):
    for name in files:
      if name != "_METADATA":
        os.remove(os.path.join(root, name))
  checkpointer.close()

  out = tmp_path / "resumed.npz"
  env = dict(os.environ, PYTHONPATH=_REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run([sys.executable, "-c", _RESUME, str(tmp_path / "ckpt"), str(out), str(total - cut)],
                        env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "unreadable" in proc.stderr  # the warning about the damaged step
  resumed = np.load(out)
  assert resumed["extra"].item() == repr({"dispenser": {"next_task": 7}})
  assert list(resumed["counters"]) == [straight.num_updates, straight.version]
  got = [resumed[f"arr_{i}"] for i in range(len(expected))]
  for i, (x, y) in enumerate(zip(expected, got)):
    np.testing.assert_array_equal(np.asarray(x), y, err_msg=f"leaf {i}")


def test_save_and_load_critic_for_warm_start(tmp_path):
  learner = helpers.make_learner(**{"sao.critic_warmup_steps": 100})
  learner.update(helpers.trajectories(seed=0))
  learner.save_critic(str(tmp_path / "value"))
  config = helpers.learner_config(**{"critic.init": "checkpoint", "critic.init_path": str(tmp_path / "value")})
  warm = helpers.make_learner(config)
  assert helpers.tree_equal(jax.device_get(warm.critic_params), jax.device_get(learner.critic_params))
  fresh = helpers.make_learner()
  assert not helpers.tree_equal(jax.device_get(fresh.critic_params), jax.device_get(learner.critic_params))


def test_checkpointer_saves_plain_pytrees_and_json(tmp_path):
  checkpointer = Checkpointer(str(tmp_path / "ckpt"), every=2, max_to_keep=2, async_save=False)
  assert checkpointer.restore({"tree": {"w": jax.ShapeDtypeStruct((3,), np.float32)}}) is None  # nothing saved yet
  assert checkpointer.is_due(4) and not checkpointer.is_due(3)
  tree = {"w": np.arange(3, dtype=np.float32), "b": {"c": np.ones((2, 2), np.int32)}}
  assert checkpointer.save(4, {"tree": tree}, {"note": "x", "n": 1})
  with pytest.raises(ValueError, match="JSON"):
    checkpointer.save(6, {"tree": tree}, {"bad": object()})
  with pytest.raises(ValueError, match="reserved"):
    checkpointer.save(6, {"meta": tree}, {})
  restored = checkpointer.restore({"tree": jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)})
  assert restored.step == 4 and restored.metadata == {"note": "x", "n": 1}
  assert helpers.tree_equal(restored.items["tree"], tree)
  checkpointer.close()


def test_checkpoint_module_never_names_the_learner():
  """The learner imports the checkpointer, not the other way round (no import cycle, not even for type hints)."""
  source = open(os.path.join(_REPO, "sao", "train", "checkpoint.py"), encoding="utf-8").read()
  imported = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom):
      imported.add(node.module or "")
      imported.update(f"{node.module}.{a.name}" for a in node.names)
    elif isinstance(node, ast.Import):
      imported.update(a.name for a in node.names)
  assert not [m for m in imported if m.startswith("sao.train.")], imported
  assert "Learner" not in source


def test_float32_params_load_into_a_bf16_target_as_its_cast(tmp_path):
  """A float32 value-pretraining critic warm-starts a bf16 critic: `load_params` returns the target's dtype."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from sao.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  saved = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4) / 3}
  ckpt_lib.save_params(str(tmp_path / "value"), saved)
  target = {"w": jax.ShapeDtypeStruct((3, 4), jnp.bfloat16,
                                      sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))}
  loaded = ckpt_lib.load_params(str(tmp_path / "value"), target)
  assert loaded["w"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(loaded["w"]), saved["w"].astype(jnp.bfloat16))
