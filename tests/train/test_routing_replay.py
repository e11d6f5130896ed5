"""MoE routing replay in the learner (`learner.routing_replay`): the batch carries the trajectories' routed experts
padded with −1, the policy's log-probs replay them, an update trains with them, and bad records are named."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from sao.models.config import ModelConfig
from sao.models.logprobs import token_logprobs
from sao.models.transformer import init_params
from sao.train import batching
from sao.train.learner import Learner
from sao.transport.trajectory import Trajectory
from tests.models.helpers import random_params
from tests.train.helpers import VOCAB, learner_config, one_device_mesh, trajectories


def moe_config() -> ModelConfig:
  return ModelConfig.tiny("qwen3_moe", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_heads=4,
                          num_kv_heads=2, head_dim=8, moe_intermediate_size=16)


def _with_routing(trajs: list[Trajectory], config: ModelConfig, seed: int) -> list[Trajectory]:
  """Every other trajectory gets a record of random distinct experts for all but its last token (SGLang's rows)."""
  rng = np.random.default_rng(seed)
  layers, k = config.num_layers, config.num_experts_per_tok
  for i, traj in enumerate(trajs):
    if i % 2 == 0:
      rows = traj.num_tokens - 1
      ids = np.stack([rng.choice(config.num_experts, k, replace=False) for _ in range(rows * layers)])
      traj.routed_experts = ids.reshape(rows, layers * k).astype(np.int32)
  return trajs


def _learner(**overrides) -> Learner:
  config = moe_config()
  return Learner(learner_config(**overrides), config, init_params(config, jax.random.PRNGKey(0)),
                 mesh=one_device_mesh())


def test_batch_carries_routing_and_logprobs_replay_it():
  config = moe_config()
  learner = _learner(algorithm="grpo", routing_replay=True)
  trajs = _with_routing(trajectories(0, n=4), config, seed=0)
  batch, _ = learner.make_batch(trajs)
  routed = batch["routed_experts"]
  assert routed.shape == (*batch["input_ids"].shape, 2, 2) and routed.dtype == np.int32
  for i, traj in enumerate(trajs):
    if traj.routed_experts is None:
      assert (routed[i] == -1).all()
    else:
      n = len(traj.routed_experts)
      np.testing.assert_array_equal(routed[i, :n].reshape(n, -1), traj.routed_experts)
      assert (routed[i, n:] == -1).all()
  lp, _ = learner.policy_logprobs(batch)
  params = learner.actor_params_on_host()
  ids, mask = batch["input_ids"], batch["attention_mask"]
  np.testing.assert_allclose(np.asarray(lp), np.asarray(token_logprobs(params, config, ids, mask,
                                                                       routed_experts=routed)), atol=1e-5)
  own = np.asarray(token_logprobs(params, config, ids, mask))
  changed = np.abs(np.asarray(lp) - own).max(axis=1) > 1e-4
  assert changed[0] and changed[2] and not changed[1] and not changed[3]  # replayed rows move, the others do not


@pytest.mark.parametrize("length_groups", [0, 2])
def test_update_with_replay_trains(length_groups):
  """An update on a batch with routed experts (one call, and cut into length groups) applies finite steps."""
  learner = _learner(algorithm="grpo", routing_replay=True, **{"batching.length_groups": length_groups})
  metrics = learner.update(_with_routing(trajectories(1, n=4), moe_config(), seed=1))
  assert metrics["actor/skipped"] == 0 and np.isfinite(metrics["actor/loss"])
  assert np.isfinite(metrics["actor/logprob_mismatch"])


def test_bad_records_are_named():
  config = moe_config()
  learner = _learner(algorithm="grpo", routing_replay=True)
  traj = trajectories(2, n=1)[0]
  traj.routed_experts = np.zeros((traj.num_tokens - 1, 3), np.int32)  # 3 ids per token, the policy routes 2 × 2
  with pytest.raises(ValueError, match=r"routed_experts of task 't2-0': rows of 3 ids, .* 2 layers × top-2 = 4"):
    learner.make_batch([traj])
  traj.routed_experts = np.full((traj.num_tokens - 1, 4), 8, np.int32)  # expert 8 of 8
  with pytest.raises(ValueError, match=r"routed_experts of task 't2-0': ids in \[8, 8\], outside \[-1, 8\)"):
    learner.make_batch([traj])
  usable, unusable = batching.split_unbatchable([traj, *trajectories(3, n=1)], learner.batcher)
  assert len(usable) == 1 and unusable[0][0] is traj
  with pytest.raises(ValueError, match="routing_replay needs an MoE policy"):
    Learner(learner_config(algorithm="grpo", routing_replay=True), ModelConfig.tiny("qwen3", vocab_size=VOCAB),
            None, mesh=one_device_mesh())
  off = _learner(algorithm="grpo")
  assert "routed_experts" not in off.make_batch(_with_routing(trajectories(4, n=2), config, seed=4))[0]


def test_replay_through_the_pipeline_lowers_the_learners_mismatch():
  """bf16 engine (the Sampler) → trajectories over the wire (`to_bytes` / `from_bytes`, SGLang's rows) → the
  float32 learner's batch: the log-prob mismatch to the rollout log-probs (`actor/logprob_mismatch`'s quantity)
  falls with `routing_replay` on. Measured on this seed: 0.0122 off, 0.0074 on (the rest is bf16 rounding outside
  the router, which replay does not touch)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from sao.models.sampling import Sampler, SamplingParams  # pylint: disable=g-import-not-at-top
  config = ModelConfig.tiny("qwen3_moe", vocab_size=VOCAB, num_experts=16)  # the models test's policy
  params = random_params(config, seed=0)  # std 0.1 weights: peaked enough that flipped experts show
  engine = Sampler(config.replace(dtype="bfloat16", param_dtype="bfloat16"),
                   jax.tree.map(lambda a: a.astype(jnp.bfloat16), params), prompt_buckets=(8,), batch_buckets=(4,),
                   new_token_buckets=(24,))
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, VOCAB, n) for n in (5, 6, 7, 8)]
  trajs = []
  for i, (p, c) in enumerate(zip(prompts, engine.generate(prompts, SamplingParams(max_new_tokens=24), seed=2,
                                                          return_routed_experts=True))):
    n = p.size + c.token_ids.size
    traj = Trajectory(task_id=f"r{i}", token_ids=np.concatenate([p, c.token_ids]),
                      action_mask=np.arange(n) >= p.size,
                      rollout_logprobs=np.concatenate([np.zeros(p.size, np.float32), c.logprobs]), reward=1.0,
                      routed_experts=c.routed_experts[:-1].reshape(n - 1, -1))
    trajs.append(Trajectory.from_bytes(traj.to_bytes()))
  mismatch = {}
  for replay in (False, True):
    learner = Learner(learner_config(algorithm="grpo", routing_replay=replay), config, params, mesh=one_device_mesh())
    batch, _ = learner.make_batch(trajs)
    lp, _ = learner.policy_logprobs(batch)
    action = batch["action_mask"]
    mismatch[replay] = float(np.abs(np.asarray(lp) - batch["rollout_logprobs"])[action].mean())
  assert mismatch[True] < 0.75 * mismatch[False], mismatch
