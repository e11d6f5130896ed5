"""Config validation, optimizer labels/schedules, batching (no model compiles)."""
import jax
import numpy as np
import pytest

from jax.sharding import PartitionSpec as P

from sao.models import sharding as model_sharding
from sao.train import batching, optim
from sao.train import config as config_lib
from sao.train import mesh as mesh_lib
from sao.transport.trajectory import Trajectory
from tests.train import helpers


def test_default_config_validates_and_round_trips_json():
  c = config_lib.default_learner_config()
  config_lib.validate_learner_config(c)
  assert config_lib.config_from_json(config_lib.config_to_json(c)).to_dict() == c.to_dict()


@pytest.mark.parametrize("key,value,match", [
    ("algorithm", "ppo", "algorithm"),
    ("sao.gamma", 1.5, "sao.gamma"),
    ("critic.optimizer.schedule", "linear", "critic.optimizer.schedule"),
    ("critic.init", "checkpoint", "critic.init_path"),
    ("batching.bucket_lengths", (64, 32), "batching.bucket_lengths"),
    ("actor.frozen_params", ("(",), "actor.frozen_params"),
    ("nan_guard_limit", 0, "nan_guard_limit"),
    ("actor_loss", "tis_typo", "actor_loss"),
])
def test_bad_values_name_the_key(key, value, match):
  c = helpers.learner_config()
  node = c
  *parents, leaf = key.split(".")
  for p in parents:
    node = node[p]
  node[leaf] = value
  with pytest.raises(ValueError, match=match.replace(".", r"\.")):
    config_lib.validate_learner_config(c)


def test_unknown_key_is_rejected():
  c = config_lib.default_learner_config()
  # How often to checkpoint is the run's `checkpoint_every`; the learner config holds no second copy.
  assert "every" not in c.checkpoint
  with pytest.raises(AttributeError):
    c.actor.optimizer.lr = 1.0  # locked
  c.unlock()
  c.sao.typo_key = 1
  with pytest.raises(ValueError, match="sao.typo_key"):
    config_lib.validate_learner_config(c)


def test_frozen_labels_and_counts():
  params = jax.eval_shape(lambda: helpers.actor_params())
  labels = optim.param_labels(params, (".*self_attn.*",))
  flat = {optim.param_path(p): l for p, l in jax.tree_util.tree_flatten_with_path(labels)[0]}
  assert flat["model/layers_0/self_attn/q_proj/kernel"] == optim.FROZEN
  assert flat["model/layers_1/mlp/up_proj/kernel"] == optim.TRAINABLE
  counts = optim.count_params(params, labels)
  total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  assert counts.trainable + counts.frozen == total and counts.frozen > 0


def test_schedule_warmup_then_cosine():
  c = config_lib.default_learner_config().actor.optimizer
  c.learning_rate, c.warmup_steps, c.schedule, c.total_steps = 1.0, 4, "cosine", 8
  lr = optim.learning_rate_schedule(c)
  np.testing.assert_allclose([float(lr(s)) for s in (0, 3, 4, 6, 8)], [0.25, 1.0, 1.0, 0.5, 0.0], atol=1e-6)
  # A run shorter than its warmup (a short test run of a cosine config): the cosine spans one step after warmup,
  # and the config is valid (the schedule clamps, the config does not have to).
  learner = config_lib.default_learner_config()
  c = learner.actor.optimizer
  c.learning_rate, c.warmup_steps, c.schedule, c.total_steps, c.end_lr_fraction = 1.0, 4, "cosine", 3, 0.1
  config_lib.validate_learner_config(learner)
  lr = optim.learning_rate_schedule(c)
  np.testing.assert_allclose([float(lr(s)) for s in (0, 3, 4, 5, 9)], [0.25, 1.0, 1.0, 0.1, 0.1], atol=1e-6)


def test_mesh_shape_with_rest_axis():
  mesh = mesh_lib.make_mesh({"data": 2, "fsdp": -1, "tensor": 2})
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}
  with pytest.raises(ValueError, match="mesh"):
    mesh_lib.make_mesh({"data": 3, "fsdp": 1, "tensor": 1}, jax.devices()[:2])
  with pytest.raises(ValueError, match="unknown axes"):
    mesh_lib.make_mesh({"model": 2})


def test_one_mesh_axes_definition_and_batch_sharding_by_the_logical_rule():
  assert mesh_lib.MESH_AXES is model_sharding.MESH_AXES
  assert set(config_lib.default_learner_config().mesh) == set(model_sharding.MESH_AXES)
  mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 1, "expert": 2, "tensor": 2})
  assert mesh.axis_names == model_sharding.MESH_AXES
  rule = dict(model_sharding.LOGICAL_AXIS_RULES)["batch"]
  assert mesh_lib.batch_sharding(mesh).spec == P(rule)  # data, fsdp and expert all shard the batch
  assert mesh_lib.batch_parallel_size(mesh) == 4
  assert mesh_lib.batch_sharding(mesh, 2).spec == P(rule, None)


def test_batching_pads_buckets_and_drops():
  trajs = helpers.trajectories(0, n=5, min_len=6, max_len=14)
  trajs[1].status = "timeout"
  trajs[2].status = "env_error"
  batcher = batching.Batcher((8, 16, 32), batch_multiple=4)
  batch, stats = batcher(trajs)
  assert stats.num_trajectories == 3 and stats.num_dropped_status == 2
  assert batch["input_ids"].shape == (4, 16) and stats.padded_shape == (4, 16)
  kept = [trajs[0], trajs[3], trajs[4]]
  for i, t in enumerate(kept):
    n = t.num_tokens
    np.testing.assert_array_equal(batch["input_ids"][i, :n], t.token_ids)
    assert batch["attention_mask"][i, :n].all() and not batch["attention_mask"][i, n:].any()
    last = t.reward_token_index()
    assert batch["token_rewards"][i, last] == t.reward and np.count_nonzero(batch["token_rewards"][i]) <= 1
  assert not batch["action_mask"][3].any() and not batch["valid"][3] and batch["rewards"][3] == 0
  assert batch["group_ids"][3] < 0 and len(set(batch["group_ids"][:3])) == len({t.group_id for t in kept})
  batching.check_batch(batch)
  long = Trajectory(task_id="x", token_ids=np.ones(40, np.int32), action_mask=np.ones(40, bool),
                    rollout_logprobs=np.full(40, -1.0, np.float32), reward=1.0)
  assert batcher([long])[0]["input_ids"].shape == (4, 64)  # beyond the largest bucket: its next multiple


def test_batching_rejects_all_dropped_and_bad_batches():
  trajs = helpers.trajectories(0, n=2)
  for t in trajs:
    t.status = "timeout"
  with pytest.raises(ValueError, match="trainable"):
    batching.Batcher((16,))(trajs)
  batch, _ = batching.Batcher((16,))(helpers.trajectories(1, n=2))
  batch["rewards"] = batch["rewards"][:1]
  with pytest.raises(ValueError, match="rewards"):
    batching.check_batch(batch)
