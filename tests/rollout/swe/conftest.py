"""Fixtures for the SWE environment tests (helpers in `swe_fixtures`)."""
from __future__ import annotations

import json

import pytest

from swe_fixtures import make_calc_repo


@pytest.fixture(scope="session")
def calc_dataset(tmp_path_factory):
  """(jsonl path, snapshot root, record) for the acme/calc instance, built once per session."""
  root = tmp_path_factory.mktemp("swe_snapshots")
  record = make_calc_repo(root)
  jsonl = root / "instances.jsonl"
  jsonl.write_text(json.dumps(record) + "\n")
  return jsonl, root, record
