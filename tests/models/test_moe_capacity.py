"""The MoE's rows in chunks of a capacity (`ModelConfig.moe_capacity_factor`, `sao.models.moe._bounded_experts`): the
same values and gradients as every row at once, in one chunk (this shard's assignments fit) and in several (they do
not), for one shard's experts and on an expert-sharded mesh of the 8 fake devices against the dense oracle."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from sao.models import moe
from sao.models.config import ModelConfig
from sao.models.layers import MoE

# float32 sums in another order (a scatter-add instead of the un-sort and einsum; the router weight applied before
# the down projection).
ATOL = 2e-5


def _close(got, want, atol=ATOL):
  want = np.asarray(want)
  np.testing.assert_allclose(np.asarray(got), want, atol=atol * max(1.0, float(np.abs(want).max())))


def _shard_problem(tokens=512, k=2, experts=8, local=2, hidden=16, width=24, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.float32)
  weights = jnp.asarray(rng.random((tokens, k)), jnp.float32)
  chosen = jnp.asarray(np.stack([rng.choice(experts, k, replace=False) for _ in range(tokens)]), jnp.int32)
  w_gate, w_up = (jnp.asarray(rng.standard_normal((local, width, hidden)) * 0.2, jnp.float32) for _ in range(2))
  w_down = jnp.asarray(rng.standard_normal((local, hidden, width)) * 0.2, jnp.float32)
  return x, weights, chosen, w_gate, w_up, w_down


def _shard_loss(chosen, capacity):
  """Jitted value and gradients (x, router weights, the three expert weights) of Σ sin(out) for shard 1's experts (2
  and 3 of 8) on `chosen`, every row at once (capacity None) or in chunks of `capacity` rows."""
  def f(x, weights, w_gate, w_up, w_down):
    out = moe._local_experts(x, weights, chosen, w_gate, w_up, w_down, first_expert=2, capacity=capacity)
    return jnp.sum(jnp.sin(out)), out
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4), has_aux=True))


@pytest.mark.parametrize("path", ["one_chunk", "chunks"])
def test_one_shards_experts_equal_every_row(path):
  """Shard 1 of 4 (experts 2 and 3 of 8) over 512 tokens × top-2: ≈ 256 of the 1,024 assignments are its own. A
  capacity of 384 holds them (one chunk: the first 384 sorted rows), one of 128 does not (3 chunks); values and the
  gradients of x, the router weights and the three expert weights equal the every-row path's."""
  x, weights, chosen, w_gate, w_up, w_down = _shard_problem()
  mine = int(np.sum((np.asarray(chosen) >= 2) & (np.asarray(chosen) < 4)))
  capacity = 384 if path == "one_chunk" else 128
  assert -(-mine // capacity) == (1 if path == "one_chunk" else 3), mine

  loss = lambda capacity: _shard_loss(chosen, capacity)

  (_, want), want_grads = loss(None)(x, weights, w_gate, w_up, w_down)
  (_, got), got_grads = loss(capacity)(x, weights, w_gate, w_up, w_down)
  _close(got, want)
  assert float(jnp.abs(want).max()) > 0.1  # the shard's experts did contribute
  for g, w in zip(got_grads, want_grads):
    _close(g, w)


def test_capacity_rows():
  assert moe.expert_capacity(4096, 8, 1.0) == 512
  assert moe.expert_capacity(4096, 8, 1.1) == 640  # 450.56 → 451 → a multiple of 128
  assert moe.expert_capacity(4096, 8, 16.0) == 4096  # never more than every row
  with pytest.raises(ValueError, match="moe_capacity_factor"):
    moe.expert_capacity(4096, 8, 0.0)
  with pytest.raises(ValueError, match="moe_capacity_factor"):
    ModelConfig.tiny("qwen3_moe", moe_capacity_factor=-1.0)


@pytest.mark.parametrize("capacity_factor", [2.0, 0.25])
def test_expert_sharded_mesh_equals_dense(capacity_factor):
  """The MoE block on `data` 2 × `expert` 4 (2 of 8 experts per shard, 128 tokens per shard gathered to 512, 1,024
  assignments of which ≈ 256 are a shard's): capacity factor 2 (512 rows: one chunk on every shard) and 0.25 (128
  rows: 2–3 chunks) both equal the dense oracle, values and gradients."""
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "expert"))
  routed = ModelConfig.tiny("qwen3_moe", moe_capacity_factor=capacity_factor)
  dense = routed.replace(moe_impl="dense", moe_capacity_factor=0.0)
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 256, routed.hidden_size))
  params = MoE(routed).init(jax.random.PRNGKey(0), x)["params"]

  def value_and_grad(config):
    loss = lambda p, x: jnp.sum(jnp.sin(MoE(config).apply({"params": p}, x)))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

  want, want_grads = value_and_grad(dense)(params, x)
  with jax.set_mesh(mesh):
    got, got_grads = value_and_grad(routed)(params, x)
  _close(got, want, atol=5e-5)
  for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    _close(g, w, atol=2.5e-4)


def test_bf16_chunks_are_as_accurate_as_every_row():
  """In bfloat16 the chunks accumulate the output and d_x in bf16 and fold the router weight into the [C, F]
  activations (`_bounded_experts`): their error against float64 (the same bf16-rounded inputs, computed in float32)
  is of the every-row path's order, for the values and for every gradient, in one chunk and in three."""
  x, weights, chosen, w_gate, w_up, w_down = _shard_problem(tokens=1024, hidden=64, width=32, seed=3)
  inputs = [a.astype(jnp.bfloat16).astype(jnp.float32) for a in (x, weights, w_gate, w_up, w_down)]
  probe = jnp.asarray(np.random.default_rng(4).standard_normal(x.shape), jnp.float32)

  def value_and_grads(capacity, dtype):
    def f(x, weights, w_gate, w_up, w_down):
      out = moe._local_experts(x, weights, chosen, w_gate, w_up, w_down, first_expert=2, capacity=capacity)
      return jnp.sum(out.astype(jnp.float32) * probe), out.astype(jnp.float32)
    cast = [a.astype(dtype) for a in inputs]
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4), has_aux=True))(*cast)

  (_, want), want_grads = value_and_grads(None, jnp.float32)
  (_, every_row), every_row_grads = value_and_grads(None, jnp.bfloat16)
  mine = int(np.sum((np.asarray(chosen) >= 2) & (np.asarray(chosen) < 4)))
  for capacity in (768, 256):  # one chunk, three
    assert -(-mine // capacity) == (1 if capacity == 768 else 3), mine
    (_, got), got_grads = value_and_grads(capacity, jnp.bfloat16)
    error = lambda a, b: float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
    scale = lambda a: float(np.max(np.abs(np.asarray(a, np.float32))))
    assert error(got, want) <= 2 * error(every_row, want) + 1e-3 * scale(want), capacity
    for name, g, r, w in zip(("x", "weights", "w_gate", "w_up", "w_down"), got_grads, every_row_grads, want_grads):
      assert error(g, w) <= 2 * error(r, w) + 1e-3 * scale(w), (capacity, name, error(g, w), error(r, w))


def test_chunks_drop_the_undefined_rows_past_their_groups(monkeypatch):
  """Megablox leaves a grouped matmul's rows past Σ group_sizes unwritten; the chunks ask it not to zero them
  (`zero_tail=False`) and drop those rows from their scatters instead. With the unwritten rows made NaN (what
  uninitialised memory may hold), in the forward products and the backward's d_lhs, the values and every gradient
  still equal the every-row path's."""
  from sao.models import grouped_matmul  # pylint: disable=g-import-not-at-top
  real_gmm = grouped_matmul._gmm  # pylint: disable=protected-access

  def unwritten_tail(lhs, rhs, group_sizes, impl, transpose_rhs, zero_tail=True):
    out = real_gmm(lhs, rhs, group_sizes, impl, transpose_rhs, zero_tail)
    if zero_tail:
      return out
    return jnp.where((jnp.arange(out.shape[0]) < jnp.sum(group_sizes))[:, None], out, jnp.nan)

  x, weights, chosen, w_gate, w_up, w_down = _shard_problem()

  loss = lambda capacity: _shard_loss(chosen, capacity)

  (_, want), want_grads = loss(None)(x, weights, w_gate, w_up, w_down)
  monkeypatch.setattr(grouped_matmul, "_gmm", unwritten_tail)
  (_, got), got_grads = loss(128)(x, weights, w_gate, w_up, w_down)  # 3 chunks, the last one part-filled
  assert np.isfinite(np.asarray(got)).all()
  _close(got, want)
  for g, w in zip(got_grads, want_grads):
    assert np.isfinite(np.asarray(g)).all()
    _close(g, w)
