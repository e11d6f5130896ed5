"""experiments/bench/profile_train.py's HLO reading: matmul FLOPs from operand shapes, op classes, model parts."""
import jax
import jax.numpy as jnp

from experiments.bench import profile_train


def _optimized_hlo(fn, *shapes):
  return jax.jit(fn).lower(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes)).compile().as_text()


def test_matmul_flops_come_from_the_operand_shapes():
  # A plain and a batched product: 2·|out|·|contracted| each, wherever XLA fused them.
  text = _optimized_hlo(lambda a, b, c, d: (jnp.tanh(a @ b), jnp.einsum("bij,bjk->bik", c, d)),
                        (64, 32), (32, 16), (3, 8, 5), (3, 5, 7))
  ops = profile_train.parse_module(text)
  matmul_flops = sum(flops for kind, flops, *_ in ops.values() if kind == "matmul")
  assert matmul_flops == 2 * 64 * 32 * 16 + 2 * 3 * 8 * 5 * 7


def test_elementwise_ops_are_not_matmuls():
  ops = profile_train.parse_module(_optimized_hlo(lambda a: jnp.exp(a) + 1.0, (128, 64)))
  assert ops and all(kind != "matmul" and flops == 0.0 for kind, flops, *_ in ops.values())
  assert any(kind.startswith("transcendental") for kind, *_ in ops.values())


def test_model_part_from_the_name_scope():
  assert profile_train._component("jit(step)/transpose(jvp(Critic))/model/layers_3/mlp/jit(silu)") == "MLP"
  assert profile_train._component("jit(step)/model/layers_0/self_attn/dot_general").startswith("attention")
  assert profile_train._component("jit(step)/select_n").startswith("other")


def test_training_shapes_count_every_linear_three_times():
  model = profile_train.ModelConfig.tiny("qwen3")
  shapes = profile_train.training_matmul_shapes(2048, 8, 256, model)
  linears = [s for s in shapes if not s[0].startswith("attn")]
  assert len(linears) == 3 * 5
  for name, lhs, rhs, _ in shapes:
    assert lhs[-1] == rhs[-2], name  # every pair multiplies
