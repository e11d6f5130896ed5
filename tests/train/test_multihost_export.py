"""`sao.train.export` in one process (the P = 1 case of the multi-host export) and its layout plan for P writers;
`sao.train.distributed`'s argument checks. The 2-process export is in test_multihost_learner.py."""
import json
import os

import jax
import ml_dtypes
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


def _with_special_values(params, seed: int):
  """`params` with -0.0, NaN (a non-default payload), ±inf, the smallest subnormal and the largest finite value
  sprinkled in: a bitwise comparison then checks what `np.array_equal` would let through."""
  rng = np.random.default_rng(seed)

  def sprinkle(x):
    x = np.array(x)
    dtype = x.dtype
    bits = np.dtype(f"uint{8 * dtype.itemsize}")
    info = ml_dtypes.finfo(dtype)
    specials = np.array([-0.0, np.inf, -np.inf, float(info.smallest_subnormal), float(info.max)], dtype)
    nan = np.array([np.nan], dtype).view(bits) | bits.type(1)  # a NaN with a payload bit set
    flat = x.reshape(-1)
    where = rng.choice(flat.size, size=min(flat.size, specials.size + 1), replace=False)
    flat[where[:-1]] = specials[:where.size - 1]
    flat.view(bits)[where[-1]] = nan[0]
    return flat.reshape(x.shape)

  return jax.tree.map(sprinkle, params)


def _tensor_bytes(directory: str) -> dict[str, bytes]:
  """Every tensor's raw bytes in the directory's safetensors files, by name."""
  from sao.models.streaming import read_header
  out = {}
  for name in sorted(os.listdir(directory)):
    if name.endswith(".safetensors"):
      path = os.path.join(directory, name)
      with open(path, "rb") as f:
        data = f.read()
      for tensor_name, t in read_header(path).items():
        out[tensor_name] = data[t.offset:t.offset + int(np.prod(t.shape)) * t.dtype.itemsize]
  return out


@pytest.mark.parametrize("model_type,dtype,mesh_axes", [
    ("qwen3_moe", "float32", None), ("qwen3_5_moe_text", "float32", {"fsdp": 2, "tensor": 2, "expert": 2}),
    ("qwen3_5_moe_text", "bfloat16", None), ("qwen3", "bfloat16", {"fsdp": 2, "tensor": 2})])
def test_exported_bytes_equal_save_pretrained_bit_for_bit(tmp_path, model_type, dtype, mesh_axes):
  """Every transform (copy, flat, linear, linear2, expert, conv), one device or sharded over a mesh, float32 or
  bfloat16: the export's tensors are `hf.save_pretrained`'s (the host numpy writer) byte for byte."""
  from sao.models.config import ModelConfig
  from sao.models.sharding import param_shardings
  from tests.models.helpers import random_params
  config = ModelConfig.tiny(model_type, dtype=dtype, param_dtype=dtype)
  host = _with_special_values(jax.device_get(random_params(config, seed=3)), seed=4)
  if mesh_axes is None:
    params = jax.device_put(host, jax.devices()[0])
  else:
    params = jax.device_put(host, param_shardings(config, mesh_lib.make_mesh(mesh_axes, jax.devices()[:8])))
  hf.save_pretrained(config, host, str(tmp_path / "reference"))
  export_policy(config, params, None, str(tmp_path / "export"))
  export_policy(config, params, None, str(tmp_path / "split"), max_shard_bytes=8_000)
  want = _tensor_bytes(str(tmp_path / "reference"))
  assert _tensor_bytes(str(tmp_path / "export")) == want
  assert _tensor_bytes(str(tmp_path / "split")) == want
  # The params are left as they were (no host value cached on them, nothing written into their buffers).
  assert all(np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
             for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(host)))


def test_tokenizer_files_are_serialised_once_per_tokenizer(tmp_path, monkeypatch):
  from sao.models.tokenizer import Tokenizer, toy_tokenizer
  tokenizer = toy_tokenizer()
  reference = tokenizer.save_pretrained(str(tmp_path / "reference"))
  calls = []
  save = Tokenizer.save_pretrained
  monkeypatch.setattr(Tokenizer, "save_pretrained", lambda self, path: calls.append(path) or save(self, path))
  from tests.models.helpers import random_params
  config = helpers.model_config()
  params = random_params(config)
  for version in (1, 2):
    directory = export_policy(config, params, tokenizer, str(tmp_path / f"v{version}"))
    for name in os.listdir(reference):
      assert (tmp_path / f"v{version}" / name).read_bytes() == (tmp_path / "reference" / name).read_bytes()
    assert Tokenizer.from_pretrained(directory).encode("7 < 9") == tokenizer.encode("7 < 9")
  assert len(calls) == 1  # the second version reuses the first one's bytes
  export_policy(config, params, toy_tokenizer(), str(tmp_path / "other"))  # another tokenizer object: serialised
  assert len(calls) == 2


def test_params_still_being_computed_are_exported_as_computed(tmp_path):
  """The export reads a CPU param's buffer in place: it must wait for the computation writing it (async dispatch).
  Exported right after a jitted init, without the wait, a policy was written as whatever the memory held."""
  from sao.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from sao.models.transformer import init_params  # pylint: disable=g-import-not-at-top
  config = ModelConfig.tiny("qwen3", vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=4,
                            num_heads=4, num_kv_heads=2, head_dim=64)
  for seed in range(2):
    params = init_params(config, jax.random.PRNGKey(seed))  # dispatched, not waited for
    out = str(tmp_path / f"v{seed}")
    export_policy(config, params, None, out)
    _, loaded = hf.load_pretrained(out)
    for want, got in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
