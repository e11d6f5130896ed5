"""`sao.train.export` in one process (the P = 1 case of the multi-host export) and its layout plan for P writers;
`sao.train.distributed`'s argument checks. The 2-process export is in test_multihost_learner.py."""
import json
import os

import jax
import numpy as np
import pytest
import safetensors.numpy

from sao.models import hf
from sao.train import distributed
from sao.train import mesh as mesh_lib
from sao.train.export import INDEX_FILE, export_policy, plan_export
from tests.train import helpers


def test_one_process_export_matches_save_pretrained(tmp_path):
  config = helpers.model_config()
  mesh = mesh_lib.make_mesh({"fsdp": 2, "tensor": 2}, jax.devices()[:4])
  learner = helpers.make_learner(mesh=mesh)  # sharded params: assembled from their shards
  host = jax.device_get(learner.actor_params)
  hf.save_pretrained(config, host, str(tmp_path / "reference"))
  export_policy(config, learner.actor_params, None, str(tmp_path / "one"))
  assert sorted(os.listdir(tmp_path / "one")) == ["config.json", "model.safetensors"]
  want = safetensors.numpy.load_file(str(tmp_path / "reference" / "model.safetensors"))
  got = safetensors.numpy.load_file(str(tmp_path / "one" / "model.safetensors"))
  assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
  assert json.loads((tmp_path / "one" / "config.json").read_text()) == json.loads(
      (tmp_path / "reference" / "config.json").read_text())
  # Split into several files: an index, and the same params back.
  export_policy(config, learner.actor_params, None, str(tmp_path / "split"), max_shard_bytes=20_000)
  index = json.loads((tmp_path / "split" / INDEX_FILE).read_text())
  assert len(set(index["weight_map"].values())) > 1 and index["weight_map"].keys() == want.keys()
  _, params = hf.load_pretrained(str(tmp_path / "split"))
  assert helpers.tree_equal(params, host)
  assert not os.path.exists(tmp_path / "split.tmp")


def test_plan_spreads_params_over_processes_in_whole_files():
  shapes = {f"model/layers_{i}/mlp/up_proj/kernel": ((8, 16), np.dtype(np.float32)) for i in range(5)}
  shapes["model/embed_tokens/embedding"] = ((64, 8), np.dtype(np.float32))
  plan = plan_export(shapes, num_processes=3, max_shard_bytes=1 << 20)
  assert sorted(set(plan.owners.values())) == [0, 1, 2] and len(plan.files) == 3
  assert [f.name for f in plan.files] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
  for path, owner in plan.owners.items():
    assert plan.files[plan.file_of[path]].owner == owner
  for f in plan.files:  # contiguous byte ranges from 0: what safetensors readers require
    ends = [0] + [t.begin + t.nbytes for t in f.tensors]
    assert [t.begin for t in f.tensors] == ends[:-1] and f.size == ends[-1]
  one = plan_export(shapes, num_processes=1, max_shard_bytes=1 << 20)
  assert [f.name for f in one.files] == ["model.safetensors"]
  with pytest.raises(ValueError, match="int8"):
    plan_export({"model/norm/scale": ((4,), np.dtype(np.int8))}, 1, 1 << 20)


def test_initialize_rejects_partial_coordinates():
  with pytest.raises(ValueError, match="together"):
    distributed.initialize("127.0.0.1:1234", num_processes=2)
  with pytest.raises(ValueError, match="outside"):
    distributed.initialize("127.0.0.1:1234", num_processes=2, process_id=2)
  assert distributed.is_coordinator()
  distributed.barrier("one process: returns at once")
