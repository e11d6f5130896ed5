"""The two attention conventions of model FLOPs (`compile_stats.full_attention_flops`,
`experiments/bench/mfu_conventions.py`): PaLM's full attention and MaxText's causal half."""
from __future__ import annotations

import pytest

from experiments.bench import mfu_conventions
from experiments.compile_tpu import model_config_of
from experiments.configs import sao_openswe
from sao.aot import compile_stats


def _model():
  return model_config_of(sao_openswe.get_config("full"), "bfloat16")


def test_full_attention_is_the_length_squared_part_of_the_model_flops():
  model = _model()
  attn_layers = sum(kind == "full_attention" for kind in model.layer_types)
  n_active, batch, length = 3e9, 4, 1024
  for train, mult in ((True, 3), (False, 1)):
    total = compile_stats.analytic_flops(model, n_active, batch, length, train)
    attention = compile_stats.full_attention_flops(model, batch, length, train)
    assert attention == mult * 4 * attn_layers * model.num_heads * model.head_dim * length ** 2 * batch
    assert total - attention == pytest.approx(mult * 2 * n_active * batch * length)  # what is left: 2·N per token


def test_the_maxtext_mfu_counts_half_the_attention_and_a_wrong_config_is_refused():
  model = _model()
  batch, length = 64, 32768
  attention = compile_stats.full_attention_flops(model, batch, length, True)
  row = {"program": "actor_step_dis", "bucket": length, "batch": batch, "train": True,
         "analytic_flops": 2 * attention, "instruction_mfu": 0.4}
  (out,) = mfu_conventions.conventions([row, dict(row, program="monte_carlo_returns", analytic_flops=0.0)], model)
  assert out["maxtext_flops"] == pytest.approx(1.5 * attention)
  assert out["maxtext_mfu"] == pytest.approx(0.4 * 0.75)
  with pytest.raises(ValueError, match="is --config the report's"):
    mfu_conventions.conventions([dict(row, analytic_flops=0.5 * attention)], model)
