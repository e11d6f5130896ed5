"""Length-grouped learner steps (`batching.length_groups`): the same update as one padded [B, T] batch, with few
compiled shapes.

Rows are sorted by length and each group padded only to its own bucket; with right padding and causal attention a
row's outputs do not depend on its padding, so params after one update must agree with the one-batch learner to
float32 rounding (Adam with eps = 1 so that parameters inherit the gradients' rounding scaled by lr, on any CPU).
"""
import jax
import numpy as np
import pytest

from sao.train import batching
from sao.train import grouped_update
from sao.train import mesh as mesh_lib
from sao.train import steps
from tests.train import helpers

_BUCKETS = (8, 16, 24, 32)


def _config(**overrides):
  return helpers.learner_config(**{"actor.optimizer.eps": 1.0, "critic.optimizer.eps": 1.0,
                                   "sao.critic_warmup_steps": 0, "batching.bucket_lengths": _BUCKETS, **overrides})


def _assert_states_close(a, b):
  for x, y in zip(jax.tree.leaves(a.opt_state), jax.tree.leaves(b.opt_state)):  # Adam's moments: the gradients
    np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5 * max(float(np.max(np.abs(x))), 1e-12))
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(y, x, rtol=0, atol=1e-7)


def test_length_groups_plan():
  lengths = np.array([5, 0, 17, 3, 9, 30, 16, 8])
  mask = (np.arange(32)[None, :] < lengths[:, None]).astype(np.int32)
  groups = batching.length_groups(mask, 3, 2, _BUCKETS)  # ⌈8/3⌉ = 3 rows, rounded up to 4
  assert [g.rows.tolist() for g in groups] == [[1, 3, 0, 7], [4, 6, 2, 5]]
  assert [g.length for g in groups] == [8, 32]
  groups = batching.length_groups(mask, 4, 1, _BUCKETS)
  assert [g.rows.tolist() for g in groups] == [[1, 3], [0, 7], [4, 6], [2, 5]]
  assert [g.length for g in groups] == [8, 8, 16, 32]
  assert sorted(np.concatenate([g.rows for g in groups]).tolist()) == list(range(8))
  # Never longer than the batch, whatever the buckets say.
  assert batching.length_groups(mask[:, :30], 1, 1, (64,))[0].length == 30
  with pytest.raises(ValueError, match="not a multiple of rows_multiple"):
    batching.length_groups(mask, 2, 3, _BUCKETS)
  with pytest.raises(ValueError, match="num_groups"):
    batching.length_groups(mask, 0, 1, _BUCKETS)


@pytest.mark.parametrize("algorithm", ["sao", "gspo"])  # token-mean and sequence-mean denominators
def test_grouped_update_equals_one_batch(algorithm):
  trajs = helpers.trajectories(seed=7, n=8, min_len=3, max_len=32)
  results = []
  for groups in (0, 4):
    overrides = {"batching.length_groups": groups, "algorithm": algorithm}
    learner = helpers.make_learner(_config(**overrides))
    batch, _ = learner.make_batch(trajs)
    assert batch["input_ids"].shape[1] == 32
    metrics, traces = learner.update_traced(batch, rows=list(range(8)))
    critic = jax.device_get(learner.critic.state) if learner.critic else None
    results.append((metrics, traces, jax.device_get(learner.actor.state), critic, batch))
  (m0, t0, a0, c0, batch), (m1, t1, a1, c1, _) = results
  assert m1["batch/grouped_padded_tokens"] < batch["input_ids"].size
  assert set(m1) - set(m0) == {"batch/grouped_padded_tokens"}
  for key in m0:
    np.testing.assert_allclose(m1[key], m0[key], rtol=1e-5, atol=1e-5, err_msg=key)
  _assert_states_close(a0, a1)
  assert not helpers.tree_equal(a1.params, helpers.actor_params())
  if algorithm == "sao":
    _assert_states_close(c0, c1)
    mask = batch["action_mask"]
    for key in ("values", "returns", "advantages"):
      np.testing.assert_allclose(np.where(mask, t1[key], 0), np.where(mask, t0[key], 0), rtol=1e-5, atol=1e-5,
                                 err_msg=key)


def test_grouped_steps_compile_once_per_group_length():
  learner = helpers.make_learner(_config(**{"batching.length_groups": 2}))
  traces0 = dict(steps.TRACE_COUNTS)
  shapes = set()
  for update in range(3):
    batch, _ = learner.make_batch(helpers.trajectories(seed=20 + update, n=8, min_len=3, max_len=32))
    shapes |= {(len(g.rows), g.length) for g in batching.length_groups(batch["attention_mask"], 2, 1, _BUCKETS)}
    learner.update(batch)
  traced = {k: v - traces0.get(k, 0) for k, v in steps.TRACE_COUNTS.items() if v != traces0.get(k, 0)}
  # One accumulate program per group shape and step kind, at most one per bucket; no retrace across updates.
  assert 1 < len(shapes) <= len(_BUCKETS)
  assert traced == {"value": len(shapes), "dis": len(shapes)}, (traced, shapes)


def test_grouped_update_on_a_sharded_mesh_equals_one_batch_on_one_device():
  """Groups of a multiple of the batch shards (data × fsdp = 4 here) on an 8-device mesh: the same update."""
  trajs = helpers.trajectories(seed=9, n=8, min_len=4, max_len=32)
  results = []
  for groups, shape in ((0, {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}),
                        (2, {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2})):
    config = _config(**{"batching.length_groups": groups})
    config.mesh.update(shape)
    mesh = mesh_lib.make_mesh(shape, jax.devices()[:int(np.prod(list(shape.values())))])
    learner = helpers.make_learner(config, mesh=mesh)
    metrics = learner.update(trajs)
    results.append((metrics, jax.device_get(learner.actor.state), jax.device_get(learner.critic.state)))
  (m0, a0, c0), (m1, a1, c1) = results
  assert m1["batch/grouped_padded_tokens"] < m0["batch/padded_rows"] * m0["batch/padded_length"]
  for key in ("actor/loss", "actor/grad_norm", "critic/loss_epoch0", "critic/loss_epoch1", "advantages/std"):
    np.testing.assert_allclose(m1[key], m0[key], rtol=1e-5, atol=1e-5, err_msg=key)
  _assert_states_close(a0, a1)
  _assert_states_close(c0, c1)


def _count_forwards(monkeypatch) -> list:
  """Counts the grouped update's critic forwards (one per call of `grouped_update.values`, over every group)."""
  forwards = []
  values = grouped_update.values
  monkeypatch.setattr(grouped_update, "values", lambda *a, **k: forwards.append(1) or values(*a, **k))
  return forwards


def test_first_critic_epoch_gives_the_pre_update_diagnostics(monkeypatch):
  """λ_critic = 1, no value clip: `update` skips the pre-update critic forward (its diagnostics come from critic
  epoch 0's forward, `sao.train.critic_stats`) and is the same update, with the same metrics, as `update_traced`,
  which runs that forward for the traces."""
  trajs = helpers.trajectories(seed=11, n=8, min_len=3, max_len=32)
  config = _config(**{"batching.length_groups": 4, "sao.gamma": 0.9})  # the one-call step shares the metrics
  results = []
  for traced in (True, False):
    learner = helpers.make_learner(config)
    monkeypatch.undo()
    forwards = _count_forwards(monkeypatch)
    batch, _ = learner.make_batch(trajs)
    metrics = learner.update_traced(batch, rows=[0])[0] if traced else learner.update(batch)
    results.append((metrics, jax.device_get(learner.critic.state), jax.device_get(learner.actor.state), forwards))
  (m0, c0, a0, f0), (m1, c1, a1, f1) = results
  assert (len(f0), len(f1)) == (2, 1)  # before and after the critic epochs / after only
  assert set(m1) == set(m0) and not any(k.startswith("critic/v0_") for k in m1)
  assert m0["critic/explained_variance"] != 0.0 and m0["critic/values/min"] < m0["critic/values/max"]
  for key in m0:
    np.testing.assert_allclose(m1[key], m0[key], rtol=1e-5, atol=1e-5, err_msg=key)
  _assert_states_close(c0, c1)
  _assert_states_close(a0, a1)


@pytest.mark.parametrize("overrides", [{"sao.lambda_critic": 0.95}, {"critic.value_clip": 0.2}])
def test_critic_targets_that_read_the_values_keep_the_pre_update_forward(monkeypatch, overrides):
  """λ_critic < 1 or a value clip read V⁰: the grouped update runs the pre-update forward, and is the same update
  as the one-call one (targets, diagnostics and states)."""
  trajs = helpers.trajectories(seed=12, n=8, min_len=3, max_len=32)
  results = []
  for groups in (0, 4):
    learner = helpers.make_learner(_config(**{"batching.length_groups": groups, **overrides}))
    monkeypatch.undo()
    forwards = _count_forwards(monkeypatch)
    batch, _ = learner.make_batch(trajs)
    metrics, traces = learner.update_traced(batch, rows=list(range(len(batch["valid"]))))
    results.append((metrics, traces, jax.device_get(learner.critic.state), jax.device_get(learner.actor.state),
                    forwards))
  (m0, t0, c0, a0, _), (m1, t1, c1, a1, f1) = results
  assert len(f1) == 2 and np.isfinite(m1["critic/explained_variance"]) and m1["critic/explained_variance"] != 0.0
  assert set(m1) - set(m0) == {"batch/grouped_padded_tokens"}
  mask = batch["action_mask"]
  for key in m0:  # a clipped fraction may count one token more or less: a value at the clip's edge, rounded
    atol = 1.01 / mask.sum() if key.endswith("clip_fraction") else 1e-5
    np.testing.assert_allclose(m1[key], m0[key], rtol=1e-5, atol=atol, err_msg=key)
  for key in ("values", "returns", "advantages"):
    np.testing.assert_allclose(np.where(mask, t1[key], 0), np.where(mask, t0[key], 0), rtol=1e-5, atol=1e-5,
                               err_msg=key)
  _assert_states_close(c0, c1)
  _assert_states_close(a0, a1)
