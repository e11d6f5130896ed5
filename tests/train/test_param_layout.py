"""Checkpoints record the param layout (linear kernels `[out..., in...]`, HF's) and refuse trees written before it
(kernels `[in, out]`): a square kernel would otherwise restore silently transposed."""
from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from sao.models.layers import PARAM_LAYOUT
from sao.train import checkpoint as ckpt_lib


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def test_checkpointer_refuses_a_step_without_the_expected_layout(tmp_path):
  tree = {"kernel": np.arange(16, dtype=np.float32).reshape(4, 4)}  # square: shapes cannot tell the layouts apart
  checkpointer = ckpt_lib.Checkpointer(str(tmp_path / "ckpt"), async_save=False)
  expect = {ckpt_lib.LAYOUT_KEY: PARAM_LAYOUT}
  assert checkpointer.save(1, {"actor": tree}, {"note": "written before the layout was recorded"})
  with pytest.raises(ValueError, match=r"no param_layout .*\[in, out\].*'hf_out_in'"):
    checkpointer.restore({"actor": _abstract(tree)}, expect=expect)
  assert checkpointer.restore({"actor": _abstract(tree)}).step == 1  # without `expect`: a plain restore
  assert checkpointer.save(2, {"actor": tree}, {ckpt_lib.LAYOUT_KEY: "in_out"})
  with pytest.raises(ValueError, match=r"param_layout='in_out'"):
    checkpointer.restore({"actor": _abstract(tree)}, step=2, expect=expect)
  assert checkpointer.save(3, {"actor": tree}, {ckpt_lib.LAYOUT_KEY: PARAM_LAYOUT})
  restored = checkpointer.restore({"actor": _abstract(tree)}, expect=expect)
  assert restored.step == 3
  np.testing.assert_array_equal(np.asarray(restored.items["actor"]["kernel"]), tree["kernel"])
  checkpointer.close()


def test_saved_params_record_the_layout_and_old_ones_are_refused(tmp_path):
  tree = {"kernel": np.arange(16, dtype=np.float32).reshape(4, 4)}
  path = str(tmp_path / "value")
  ckpt_lib.save_params(path, tree)
  with open(os.path.join(path, ckpt_lib.PARAMS_META), encoding="utf-8") as f:
    assert json.load(f) == {ckpt_lib.LAYOUT_KEY: PARAM_LAYOUT}
  np.testing.assert_array_equal(np.asarray(ckpt_lib.load_params(path, _abstract(tree))["kernel"]), tree["kernel"])
  os.remove(os.path.join(path, ckpt_lib.PARAMS_META))  # as a directory saved before the layout was recorded
  with pytest.raises(ValueError, match=r"critic.init_path .*no param_layout"):
    ckpt_lib.load_params(path, _abstract(tree))
