"""`sao.train.precompile`: every group shape an update can meet is compiled ahead, into the caches the update hits."""
from __future__ import annotations

import jax
import jax.monitoring
import ml_collections
from jax._src import compilation_cache  # reset_cache: the cache directory is read once per process otherwise
import numpy as np
import pytest

from sao.core.advantages import place_terminal_reward
from sao.train import batching, phases, precompile, steps
from sao.train import learner as learner_lib
from sao.train import trainer as trainer_lib
from tests.train import helpers

_BUCKETS = (8, 16, 24, 32)
_MAX_LEN = 30


def _config(algorithm: str, **overrides):
  # Two buckets and two groups of 4 rows: two group shapes, few programs to compile.
  return helpers.learner_config(**{"algorithm": algorithm, "sao.critic_warmup_steps": 0,
                                   "batching.bucket_lengths": (16, 32), "batching.length_groups": 2, **overrides})


class _Compiles:
  """Counts, while it is entered, XLA compilations (JAX's monitoring events: `count` includes loads from the
  persistent cache), the compilations that asked the persistent cache and its hits."""

  def __enter__(self):
    self.count = self.cache_requests = self.cache_hits = 0
    jax.monitoring.register_event_duration_secs_listener(self._duration)
    jax.monitoring.register_event_listener(self._event)
    return self

  def _duration(self, event: str, _secs: float, **_kwargs) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
      self.count += 1

  def _event(self, event: str, **_kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
      self.cache_hits += 1
    elif event == "/jax/compilation_cache/compile_requests_use_cache":
      self.cache_requests += 1

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._duration)
    jax.monitoring.unregister_event_listener(self._event)


@pytest.fixture
def fresh_compilation_cache(tmp_path):
  """A new, empty persistent compilation cache directory for the test (tests/train shares one otherwise)."""
  saved = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "xla_cache"))
  compilation_cache.reset_cache()
  yield
  jax.config.update("jax_compilation_cache_dir", saved)
  compilation_cache.reset_cache()


@pytest.mark.parametrize("rows,num_groups,multiple", [(8, 3, 1), (8, 2, 2), (10, 4, 1), (64, 16, 1), (6, 1, 2)])
def test_group_shapes_cover_every_shape_length_groups_cuts(rows, num_groups, multiple):
  rng = np.random.default_rng(rows * num_groups + multiple)
  shapes = set(batching.group_shapes(rows, num_groups, multiple, _BUCKETS, _MAX_LEN))
  seen = set()
  for _ in range(200):
    lengths = rng.integers(1, _MAX_LEN + 1, rows)
    if rng.random() < 0.3:  # batches of short rows only: the batch's own T is a small bucket
      lengths = rng.integers(1, 9, rows)
    num_tokens = batching.bucket_length(int(lengths.max()), _BUCKETS)  # the batch's T, as the Batcher pads it
    mask = (np.arange(num_tokens)[None, :] < lengths[:, None]).astype(np.int32)
    seen |= {(len(g.rows), g.length) for g in batching.length_groups(mask, num_groups, multiple, _BUCKETS)}
  assert seen <= shapes, seen - shapes
  assert {length for _, length in shapes} == {8, 16, 24, 32}


def test_group_shapes_rejects_bad_sizes():
  for args in ((0, 2, 1, _BUCKETS, 8), (8, 0, 1, _BUCKETS, 8), (8, 2, 0, _BUCKETS, 8), (8, 2, 1, _BUCKETS, 0)):
    with pytest.raises(ValueError, match="group_shapes"):
      batching.group_shapes(*args)


# The grouped path with a critic, the one-call path without (the one-call SAO path: the critic-only and trainer tests).
@pytest.mark.parametrize("algorithm,length_groups", [("sao", 2), ("gspo", 0), ("gspo", 2)])
def test_precompiled_updates_compile_nothing_and_equal_updates_without_it(algorithm, length_groups):
  rows = 8
  config = _config(algorithm, **{"batching.length_groups": length_groups})
  learner, reference = helpers.make_learner(config), helpers.make_learner(config)
  compiled = list(learner.precompile(rows, _MAX_LEN))
  assert compiled and all(isinstance(name, str) for name in compiled)
  traces = dict(steps.TRACE_COUNTS)
  # Every row has an action token (min_len 5: a batch of 8 rows, as precompiled); the last batch fits T = 16.
  batches = [helpers.trajectories(seed=40 + i, n=rows, min_len=5, max_len=_MAX_LEN) for i in range(2)]
  batches.append(helpers.trajectories(seed=50, n=rows, min_len=5, max_len=14))
  with _Compiles() as compiles:
    metrics = [learner.update(batch) for batch in batches]
  assert compiles.count == 0 and dict(steps.TRACE_COUNTS) == traces
  for m, batch in zip(metrics, batches):
    expected = reference.update(batch)
    assert m.keys() == expected.keys()
    for key in m:
      np.testing.assert_allclose(m[key], expected[key], rtol=1e-6, atol=1e-7, err_msg=key)
  for a, b in zip(jax.tree.leaves(jax.device_get(learner.actor.state)),
                  jax.tree.leaves(jax.device_get(reference.actor.state))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_precompile_checks_roles_and_sizes():
  gspo = helpers.make_learner(_config("gspo"))
  for roles in (("critic",), ("actor", "optimizer"), ()):
    with pytest.raises(ValueError, match="precompile: roles"):
      gspo.precompile(8, _MAX_LEN, roles)
  for size, tokens in ((0, _MAX_LEN), (8, 0)):
    with pytest.raises(ValueError, match="precompile: batch_size"):
      gspo.precompile(size, tokens)


def test_critic_only_precompile_leaves_the_actor_step_to_the_update():
  # Value pretraining precompiles ("critic",): its updates (inside the critic warmup) compile nothing.
  config = _config("sao", **{"batching.length_groups": 0, "sao.critic_warmup_steps": 5})
  learner = helpers.make_learner(config)
  names = list(learner.precompile(8, _MAX_LEN, ("critic",)))
  assert names == ["update [8, 16] (critic)", "update [8, 32] (critic)"]
  with _Compiles() as compiles:
    metrics = learner.update(helpers.trajectories(seed=80, n=8, min_len=5, max_len=_MAX_LEN))
  assert compiles.count == 0 and metrics["actor/warmup"] == 1.0


def test_precompiler_thread_compiles_while_updates_run_and_stops_early():
  config = _config("sao")
  learner = helpers.make_learner(config)
  expected = len(list(helpers.make_learner(config).precompile(8, _MAX_LEN)))
  precompiler = precompile.Precompiler(learner.precompile(8, _MAX_LEN), "test")
  for i in range(2):  # updates donate the live states while the thread lowers from abstract ones
    learner.update(helpers.trajectories(seed=60 + i, n=8, min_len=5, max_len=_MAX_LEN))
  precompiler.stop()
  assert precompiler.done and precompiler.error is None and len(precompiler.compiled) == expected
  stopped = precompile.Precompiler(helpers.make_learner(config).precompile(8, _MAX_LEN), "test")
  stopped.stop()
  assert stopped.done and stopped.error is None and len(stopped.compiled) <= 1


def test_precompiler_logs_an_error_and_ends(monkeypatch):
  learner = helpers.make_learner(_config("sao"))

  def broken(*args):
    raise RuntimeError("compile failed")

  monkeypatch.setattr(learner._grouped_actor_step, "precompile", broken)  # pylint: disable=protected-access
  precompiler = precompile.Precompiler(learner.precompile(8, _MAX_LEN), "test")
  precompiler.stop(timeout_s=60)
  assert precompiler.done and isinstance(precompiler.error, RuntimeError) and precompiler.compiled == []
  learner.update(helpers.trajectories(seed=70, n=8, min_len=5, max_len=_MAX_LEN))  # compiles on demand instead


def test_batcher_token_rewards_equal_place_terminal_reward():
  rng = np.random.default_rng(3)
  trajs = helpers.trajectories(seed=5, n=12, min_len=2, max_len=30)
  for t in trajs:
    t.reward = float(rng.normal())
  batch, _ = batching.Batcher(_BUCKETS)(trajs)
  expected, _ = place_terminal_reward(batch["rewards"], batch["action_mask"])
  np.testing.assert_array_equal(batch["token_rewards"], np.asarray(expected))


def test_the_trainers_warm_start_precompile_serves_its_later_learners_from_the_cache(fresh_compilation_cache,
                                                                                     tmp_path):
  # `Trainer._precompile_ahead` (the supervised warm start's thread): value pretraining's critic programs and the RL
  # learner's, compiled on abstract learners (no params) of the trainer's own configs; then both real learners'
  # updates only read the cache (in a fresh cache without it every request misses), and the trainer does not
  # precompile them again.
  learner = helpers.learner_config(**{"algorithm": "sao", "sao.critic_warmup_steps": 0, "mesh.fsdp": -1,
                                      "batching.bucket_lengths": (16, 32), "batching.length_groups": 2})
  config = ml_collections.ConfigDict(dict(seed=0, learner=learner, rollout=dict(batch_size=8, max_total_tokens=30),
                                          recipe=dict(value_pretrain_steps=2)))
  trainer = trainer_lib.Trainer(config, str(tmp_path / "work"), tokenizer=None, train_tasks=[], validation_tasks=[])
  trainer._precompile_ahead(helpers.model_config())  # pylint: disable=protected-access
  [ahead] = trainer._precompilers  # pylint: disable=protected-access
  ahead.wait(timeout_s=600)
  assert ahead.error is None and any("critic" in name for name in ahead.compiled)
  batch = helpers.trajectories(seed=95, n=8, min_len=5, max_len=_MAX_LEN)
  for phase_config in (phases.value_pretrain_config(config), phases.rl_config(config)):
    real = learner_lib.Learner(phase_config, helpers.model_config(), helpers.actor_params())
    trainer._precompile(real)  # pylint: disable=protected-access
    with _Compiles() as compiles:
      real.update(batch)
    assert compiles.cache_hits == compiles.cache_requests == compiles.count > 0
  assert len(trainer._precompilers) == 1  # pylint: disable=protected-access
  trainer.writer.close()
