"""The two attention counts of model FLOPs (`compile_stats.analytic_flops`, causal — the project's and MaxText's —
and `full_attention_flops`, PaLM's full attention) and `experiments/bench/mfu_conventions.py`, which prints both and
recounts old full-attention rows."""
from __future__ import annotations

import json

import pytest

from experiments.bench import mfu_conventions
from experiments.compile_tpu import model_config_of
from experiments.configs import sao_openswe
from sao.aot import compile_stats, report


def _model():
  return model_config_of(sao_openswe.get_config("full"), "bfloat16")


def test_the_model_flops_count_half_of_full_attention():
  model = _model()
  attn_layers = sum(kind == "full_attention" for kind in model.layer_types)
  n_active, batch, length = 3e9, 4, 1024
  for train, mult in ((True, 3), (False, 1)):
    total = compile_stats.analytic_flops(model, n_active, batch, length, train)
    attention = compile_stats.full_attention_flops(model, batch, length, train)
    assert attention == mult * 4 * attn_layers * model.num_heads * model.head_dim * length ** 2 * batch
    assert total == pytest.approx(mult * 2 * n_active * batch * length + attention / 2)


def _row(attention, batch, length, **fields):
  return dict({"program": "actor_step_dis", "bucket": length, "batch": batch, "train": True, "num_layers": 40,
               "analytic_flops": 2 * attention, "instruction_mfu": 0.4, "estimated_mfu": 0.5}, **fields)


def test_both_mfus_of_either_kind_of_row_and_a_wrong_config_is_refused():
  model = _model()
  batch, length = 64, 32768
  attention = compile_stats.full_attention_flops(model, batch, length, True)
  old = _row(attention, batch, length)  # PaLM's count: dense = attention
  (out,) = mfu_conventions.conventions([old, dict(old, program="monte_carlo_returns", analytic_flops=0.0)], model)
  assert out["causal_flops"] == pytest.approx(1.5 * attention) and out["convention"] == "full_attention"
  assert out["full_mfu"] == pytest.approx(0.4) and out["causal_mfu"] == pytest.approx(0.4 * 0.75)
  new = _row(attention, batch, length, analytic_flops=1.5 * attention, instruction_mfu=0.3,
             model_flops_convention="causal_attention")
  (same,) = mfu_conventions.conventions([new], model)
  assert same["full_mfu"] == pytest.approx(0.4) and same["causal_mfu"] == pytest.approx(0.3)
  with pytest.raises(ValueError, match="is --config the report's"):
    mfu_conventions.conventions([dict(old, analytic_flops=0.5 * attention)], model)


def test_recount_rewrites_full_attention_rows_once_and_a_slice_by_its_own_depth(tmp_path):
  model = _model()
  batch, length = 64, 8192
  attention = compile_stats.full_attention_flops(model, batch, length, True)
  rows = [_row(attention, batch, length), dict(_row(attention, batch, length), program="monte_carlo_returns",
                                               analytic_flops=0.0, instruction_mfu=None, estimated_mfu=None)]
  changed = mfu_conventions.recount(rows, model)
  assert len(changed) == 1 and all(r["model_flops_convention"] == "causal_attention" for r in rows)
  assert rows[0]["analytic_flops"] == pytest.approx(1.5 * attention)
  assert rows[0]["instruction_mfu"] == pytest.approx(0.3) and rows[0]["estimated_mfu"] == pytest.approx(0.375)
  assert mfu_conventions.recount(rows, model) == []  # idempotent
  # A 4-layer slice: its attention is the slice's (one full-attention layer of four), not the whole model's.
  sliced = model_config_of(sao_openswe.get_config("full"), "bfloat16")
  from experiments.compile_tpu import truncated  # pylint: disable=g-import-not-at-top
  slice_attention = compile_stats.full_attention_flops(truncated(sliced, 4), batch, length, True)
  (slice_row,) = [_row(slice_attention, batch, length, num_layers=4)]
  mfu_conventions.recount([slice_row], model)
  assert slice_row["analytic_flops"] == pytest.approx(1.5 * slice_attention)
  # The file round trip: report rows of either kind load with their count.
  path = tmp_path / "r.json"
  report.write_json_atomically(str(path), rows)
  assert json.loads(path.read_text())[0]["model_flops_convention"] == "causal_attention"
