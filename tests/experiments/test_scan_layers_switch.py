"""`model.scan_layers`: on in every shipped `full` variant (through `common.full_precision`), off in the toys (the
README's main job unchanged), and carried into the ModelConfig the trainer and the compile report build. A real
checkpoint run on CPU in float32 (`sao_openswe.py:smollm2`) scans its layers too, for compile time (REAL_CPU)."""
from __future__ import annotations

import importlib
import pathlib

import pytest

from experiments.compile_tpu import model_config_of
from experiments.configs import sao_openswe

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "configs"
MODULES = sorted(p.stem for p in CONFIG_DIR.glob("*.py") if p.stem not in ("__init__", "common", "pod_layout"))
REAL_CPU = {("sao_openswe", "smollm2")}  # float32 on CPU, layers scanned: one layer's programs compile, not thirty


@pytest.mark.parametrize("name", MODULES)
def test_full_variants_scan_and_toys_do_not(name):
  module = importlib.import_module(f"experiments.configs.{name}")
  for variant in module.VARIANTS:
    config = module.get_config(variant)
    scans = (config.model.param_dtype == "bfloat16") or (name, variant) in REAL_CPU
    assert config.model.scan_layers == scans, (name, variant)
  if "toy" in module.VARIANTS:
    assert module.get_config("toy").model.scan_layers is False


def test_model_config_carries_the_switch():
  assert model_config_of(sao_openswe.get_config("full")).scan_layers is True
  assert model_config_of(sao_openswe.get_config("toy")).scan_layers is False
