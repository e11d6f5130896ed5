"""Streaming loads (`sao.models.streaming`) equal `hf.load_pretrained` (the host-numpy oracle) leaf for leaf and shard
for shard, on one device and on an fsdp × tensor × expert mesh of the 8 fake CPU devices."""
import json
import os
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from sao.models import hf, streaming, transformer
from sao.models.config import ModelConfig
from sao.train.mesh import make_mesh
from tests.models.helpers import random_params

SHARDED_MESH = {"fsdp": 2, "tensor": 2, "expert": 2}


def _write(tmp_path, model_type: str, critic: bool, index: bool, **overrides) -> str:
  config = ModelConfig.tiny(model_type, **overrides)
  directory = str(tmp_path / f"{model_type}_{'critic' if critic else 'policy'}_{'index' if index else 'single'}")
  hf.save_pretrained(config, random_params(config, seed=1, critic=critic), directory,
                     max_shard_bytes=64 * 1024 if index else 4 * 1024 ** 3)
  assert os.path.exists(os.path.join(directory, "model.safetensors.index.json")) == index
  return directory


def _assert_equal_to_oracle(directory: str, target, critic: bool = False, **kwargs) -> dict:
  want_config, want = hf.load_pretrained(directory, critic=critic, **kwargs)
  config, got = streaming.load_pretrained_sharded(directory, target, critic=critic, **kwargs)
  assert config == want_config
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
    assert g.dtype == w.dtype and g.shape == w.shape, path
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=jax.tree_util.keystr(path))
    for shard in g.addressable_shards:  # each device holds exactly its slice of the oracle
      np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(w)[shard.index],
                                    err_msg=f"{jax.tree_util.keystr(path)} on {shard.device}")
  return got


@pytest.mark.parametrize("model_type,critic,index", [
    ("llama", False, False), ("qwen2", True, True), ("qwen3", False, True), ("qwen3", True, False),
    ("qwen3_moe", False, True), ("qwen3_moe", True, False), ("qwen3_5_moe_text", False, False),
    ("qwen3_5_moe_text", True, True)])
def test_streamed_params_equal_load_pretrained(tmp_path, model_type, critic, index):
  overrides = {"tie_word_embeddings": True} if model_type == "llama" else {}
  directory = _write(tmp_path, model_type, critic, index, **overrides)
  _assert_equal_to_oracle(directory, None, critic)  # one device
  got = _assert_equal_to_oracle(directory, make_mesh(SHARDED_MESH), critic)
  specs = {str(x.sharding.spec) for x in jax.tree.leaves(got)}
  assert any("fsdp" in s and "tensor" in s for s in specs), specs  # the mesh really shards
  if model_type in ("qwen3_moe", "qwen3_5_moe_text"):
    assert any("expert" in s for s in specs), specs


def test_fsdp_only_mesh_and_explicit_sharding_tree(tmp_path):
  directory = _write(tmp_path, "qwen3_moe", False, True)
  _assert_equal_to_oracle(directory, make_mesh({"fsdp": 8}))
  config = ModelConfig.from_pretrained(directory)
  from sao.models.sharding import param_shardings
  _assert_equal_to_oracle(directory, param_shardings(config, make_mesh({"tensor": 4, "fsdp": 2})))


def test_dtype_conversion_per_slice(tmp_path):
  directory = _write(tmp_path, "qwen3_moe", False, False)
  _assert_equal_to_oracle(directory, make_mesh(SHARDED_MESH), dtype="bfloat16")  # float32 file → bf16 params
  config, params = hf.load_pretrained(directory, dtype="bfloat16")
  hf.save_pretrained(config, params, str(tmp_path / "bf16"), max_shard_bytes=32 * 1024)
  _assert_equal_to_oracle(str(tmp_path / "bf16"), make_mesh(SHARDED_MESH))  # bf16 file → float32 params


def test_partial_rows_read_in_pieces(tmp_path, monkeypatch):
  # A chunk smaller than one row forces the row-by-row path (only the needed columns are read).
  monkeypatch.setattr(streaming, "_CHUNK_BYTES", 24)
  directory = _write(tmp_path, "qwen3_5_moe_text", False, True)
  _assert_equal_to_oracle(directory, make_mesh(SHARDED_MESH))


def test_fused_experts_and_multimodal_prefix(tmp_path):
  directory = _write(tmp_path, "qwen3_5_moe_text", False, False)
  config = ModelConfig.from_pretrained(directory)
  tensors = safetensors.numpy.load_file(os.path.join(directory, "model.safetensors"))
  fused = {"model.language_model." + name[len("model."):] if name.startswith("model.") else name: w
           for name, w in tensors.items() if ".experts." not in name}
  for layer in range(config.num_layers):
    base = f"model.layers.{layer}.mlp.experts"
    per = lambda kind: np.stack([tensors[f"{base}.{e}.{kind}.weight"] for e in range(config.num_experts)])
    fused[f"model.language_model.layers.{layer}.mlp.experts.gate_up_proj"] = np.concatenate(
        [per("gate_proj"), per("up_proj")], axis=1)
    fused[f"model.language_model.layers.{layer}.mlp.experts.down_proj"] = per("down_proj")
  fused["mtp.fc.weight"] = np.zeros((4, 4), np.float32)  # skipped, as load_pretrained skips it
  out = tmp_path / "fused"
  out.mkdir()
  (out / "config.json").write_text(open(os.path.join(directory, "config.json")).read())
  safetensors.numpy.save_file(fused, str(out / "model.safetensors"), metadata={"format": "pt"})
  got = _assert_equal_to_oracle(str(out), make_mesh(SHARDED_MESH))
  _, per_expert = hf.load_pretrained(directory)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(per_expert)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _edit_checkpoint(directory: str, edit) -> None:
  path = os.path.join(directory, "model.safetensors")
  tensors = safetensors.numpy.load_file(path)
  edit(tensors)
  safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("problem,named", [
    ("missing", "model/layers_1/mlp/up_proj/kernel (HF model.layers.1.mlp.up_proj.weight)"),
    ("shape", "model.layers.0.self_attn.k_proj.weight: shape (32, 63)"),
    ("unknown", "model.layers.0.mlp.extra.weight"),
    ("missing_expert", "model/layers_0/mlp/experts/down_proj[expert 3]")])
def test_errors_name_the_tensor_before_any_device_array(tmp_path, monkeypatch, problem, named):
  directory = _write(tmp_path, "qwen3_moe" if problem == "missing_expert" else "qwen3", False, False)
  edits = {"missing": lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
           "shape": lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": np.zeros((32, 63), np.float32)}),
           "unknown": lambda t: t.update({"model.layers.0.mlp.extra.weight": np.zeros((2, 2), np.float32)}),
           "missing_expert": lambda t: t.pop("model.layers.0.mlp.experts.3.down_proj.weight")}
  _edit_checkpoint(directory, edits[problem])
  with pytest.raises(ValueError) as want:
    hf.load_pretrained(directory)
  assert named in str(want.value)

  def no_device_arrays(*args, **kwargs):
    raise AssertionError("a device array was created before the checkpoint was validated")

  monkeypatch.setattr(streaming.jax, "make_array_from_callback", no_device_arrays)
  with pytest.raises(ValueError) as got:
    streaming.load_pretrained_sharded(directory, make_mesh(SHARDED_MESH))
  assert str(got.value) == str(want.value)


def test_truncated_file_names_the_tensor(tmp_path):
  directory = _write(tmp_path, "qwen3", False, False)
  path = os.path.join(directory, "model.safetensors")
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) - 4)
  with pytest.raises(ValueError, match="data_offsets"):
    streaming.load_pretrained_sharded(directory)


def test_each_byte_read_once_on_one_device(tmp_path):
  directory = _write(tmp_path, "qwen3_moe", False, True)
  counter = [0]
  streaming.load_pretrained_sharded(directory, None, bytes_read=counter)
  with open(os.path.join(directory, "model.safetensors.index.json")) as f:
    assert counter[0] == json.load(f)["metadata"]["total_size"]


_MEMORY_PROBE = r"""
import json, sys
import jax
import ml_dtypes
import jax.numpy as jnp
import numpy as np
from sao.models import hf, streaming, transformer
# Warm the runtime up first (its first transfers allocate ~30 MB that neither loader should be charged for).
small = jax.make_array_from_callback((4,), jax.sharding.SingleDeviceSharding(jax.devices()[0]), lambda i: np.ones(4)[i])
jax.block_until_ready([small, jax.numpy.asarray(np.ones(4)) + 1])
try:
  open("/proc/self/clear_refs", "w").write("5")  # resets VmHWM to the current RSS
except OSError:
  pass
def status(key):
  return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))
before = status("VmRSS")
load = hf.load_pretrained if sys.argv[2] == "old" else streaming.load_pretrained_sharded
_, params = load(sys.argv[1])
jax.block_until_ready(params)
print(json.dumps({"growth": status("VmHWM") - before, "params": sum(x.nbytes for x in jax.tree.leaves(params))}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads peak RSS from /proc (Linux)")
def test_peak_host_memory_is_about_one_tensor(tmp_path):
  # 124 MiB of float32 (embed and lm_head 4096×512, nine layers); the largest tensor is 8 MiB.
  config = ModelConfig.tiny("qwen3", vocab_size=4096, hidden_size=512, intermediate_size=1536, num_layers=9,
                            num_heads=8, num_kv_heads=4, head_dim=64)
  rng = np.random.default_rng(0)
  from sao.models.transformer import abstract_params
  import flax.linen as nn
  params = jax.tree.map(lambda s: rng.standard_normal(s.shape, np.float32), nn.meta.unbox(abstract_params(config)))
  size = sum(x.nbytes for x in jax.tree.leaves(params))
  hf.save_pretrained(config, params, str(tmp_path / "ckpt"), max_shard_bytes=40 * 1024 ** 2)
  del params
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")  # one device: the params are stored once
  overhead = {}
  for kind in ("old", "new"):
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(tmp_path / "ckpt"), kind], env=env, check=True,
                         capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    assert r["params"] == size
    overhead[kind] = (r["growth"] - r["params"]) / size  # on CPU the device arrays are host memory: subtract them
  # Streaming holds about one tensor (its host slices while they are copied into the device buffers) and a read
  # chunk besides the params; the old loader holds a second copy of the model (the host numpy tree while jax
  # copies it into arrays), anonymous memory that stays resident. Measured: new 0.03-0.15×, old 0.8×.
  assert overhead["new"] < 0.3, overhead
  assert overhead["old"] > 0.6, overhead


def test_trainer_streams_an_hf_base_policy_into_the_learner_shardings(tmp_path):
  import ml_collections
  from sao.models.transformer import abstract_params
  from sao.train import mesh as mesh_lib
  from sao.train.trainer import Trainer
  directory = _write(tmp_path, "qwen3_moe", False, True)
  config = ml_collections.ConfigDict(dict(model=dict(init="hf", hf_path=directory),
                                          learner=dict(mesh=dict(data=1, fsdp=2, expert=2, tensor=2))))
  trainer = Trainer(config, str(tmp_path / "work"), tokenizer=None, train_tasks=[], validation_tasks=[])
  try:
    model_config, params, base_dir = trainer.base_policy(None)
  finally:
    trainer.writer.close()
  assert base_dir == directory
  want_config, want = hf.load_pretrained(directory)
  assert model_config == want_config
  mesh = mesh_lib.make_mesh(dict(config.learner.mesh))
  shardings = mesh_lib.param_shardings(abstract_params(model_config), mesh)  # what the Learner's state uses
  for got, w, sharding in zip(jax.tree.leaves(params), jax.tree.leaves(want), jax.tree.leaves(shardings)):
    assert got.sharding == sharding
    np.testing.assert_array_equal(np.asarray(got), np.asarray(w))


def test_trainer_loads_the_base_policy_in_the_configured_precision(tmp_path):
  import ml_collections
  from sao.train.trainer import Trainer
  directory = _write(tmp_path, "qwen3_moe", False, True)
  config = ml_collections.ConfigDict(dict(
      model=dict(init="hf", hf_path=directory, param_dtype="bfloat16", compute_dtype="bfloat16", remat="full"),
      learner=dict(mesh=dict(data=1, fsdp=2, expert=2, tensor=2))))
  trainer = Trainer(config, str(tmp_path / "work"), tokenizer=None, train_tasks=[], validation_tasks=[])
  try:
    model_config, params, _ = trainer.base_policy(None)
  finally:
    trainer.writer.close()
  assert (model_config.param_dtype, model_config.dtype, model_config.remat) == ("bfloat16", "bfloat16", "full")
  _, want = hf.load_pretrained(directory)
  for got, w in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
    assert got.dtype == jax.numpy.bfloat16
    np.testing.assert_array_equal(np.asarray(got), np.asarray(w).astype(jax.numpy.bfloat16))


def test_read_header_matches_safetensors_and_rejects_garbage(tmp_path):
  import ml_dtypes
  path = str(tmp_path / "t.safetensors")
  tensors = {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.ones((4,), ml_dtypes.bfloat16),
             "c": np.zeros((2, 0, 3), np.int32)}
  safetensors.numpy.save_file(tensors, path)
  header = streaming.read_header(path)
  assert list(header) == ["a", "b", "c"]
  for name, t in header.items():
    assert (t.dtype, t.shape) == (tensors[name].dtype, tensors[name].shape)
    view = streaming._View(t, t.shape)
    np.testing.assert_array_equal(view.read(tuple((0, n) for n in t.shape), [0]), tensors[name])
  (tmp_path / "bad").write_bytes((4).to_bytes(8, "little") + b"nope")
  with pytest.raises(ValueError, match="not JSON"):
    streaming.read_header(str(tmp_path / "bad"))


def test_abstract_params_is_memoised_but_returns_fresh_containers():
  config = ModelConfig.tiny("qwen3", vocab_size=300)
  first = transformer.abstract_params(config)
  first["model"].clear()  # a caller that edits its tree does not edit the next caller's
  second, third = transformer.abstract_params(config), transformer.abstract_params(config)
  assert second["model"] and second is not third
  assert jax.tree.structure(second) == jax.tree.structure(third)
  assert [(l.shape, l.dtype) for l in jax.tree.leaves(second)] == [(l.shape, l.dtype) for l in jax.tree.leaves(third)]
  critic = transformer.abstract_params(config, critic=True)
  assert "value_head" in critic and "lm_head" not in critic
  other = transformer.abstract_params(ModelConfig.tiny("qwen3", vocab_size=301))
  assert other["lm_head"]["kernel"].value.shape[0] == 301  # a different config is traced afresh ([V, E])


@pytest.mark.parametrize("stored,loaded,mesh_axes", [
    ("float32", "float32", None), ("float32", "bfloat16", None), ("bfloat16", "float32", SHARDED_MESH),
    ("bfloat16", "bfloat16", None)])
def test_loads_bit_for_bit_with_special_values(tmp_path, stored, loaded, mesh_axes):
  """-0.0, a NaN with a payload, ±inf, subnormals: each param's bits are `hf.load_pretrained`'s (numpy's casts),
  read straight into aligned buffers that the device takes over, or converted on the host."""
  config = ModelConfig.tiny("qwen3_5_moe_text", dtype=stored, param_dtype=stored)
  rng = np.random.default_rng(5)

  def sprinkle(x):
    x = np.array(x)
    bits = np.dtype(f"uint{8 * x.dtype.itemsize}")
    info = ml_dtypes.finfo(x.dtype)
    flat = x.reshape(-1)
    where = rng.choice(flat.size, size=min(flat.size, 5), replace=False)
    values = np.array([-0.0, np.inf, float(info.smallest_subnormal), -float(info.tiny) / 2], x.dtype)
    flat[where[:-1]] = values[:where.size - 1]
    flat.view(bits)[where[-1]] = (np.array([np.nan], x.dtype).view(bits) | bits.type(1))[0]
    return flat.reshape(x.shape)

  params = jax.tree.map(sprinkle, jax.device_get(random_params(config, seed=2)))
  hf.save_pretrained(config, params, str(tmp_path / "ckpt"), max_shard_bytes=16 * 1024)
  _, want = hf.load_pretrained(str(tmp_path / "ckpt"), dtype=loaded)
  _, got = streaming.load_pretrained_sharded(str(tmp_path / "ckpt"), None if mesh_axes is None else
                                             make_mesh(mesh_axes), dtype=loaded)
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
    assert g.dtype == w.dtype, path
    assert np.asarray(g).tobytes() == np.asarray(w).tobytes(), jax.tree_util.keystr(path)


def test_a_cached_base_policy_is_reused_in_the_configured_precision(tmp_path):
  """`<workdir>/base_model` (the toy's warm-started policy, cached) holds the architecture only: reusing it applies
  the run's precision, remat and layer scan as when it was made."""
  import shutil
  import ml_collections
  from sao.train.trainer import Trainer
  directory = _write(tmp_path, "qwen3_moe", False, True)
  workdir = tmp_path / "work"
  shutil.copytree(directory, workdir / "base_model")
  config = ml_collections.ConfigDict(dict(
      model=dict(init="toy", param_dtype="bfloat16", compute_dtype="bfloat16", remat="full", scan_layers=True),
      learner=dict(mesh=dict(data=1, fsdp=1, tensor=1))))
  trainer = Trainer(config, str(workdir), tokenizer=None, train_tasks=[], validation_tasks=[])
  try:
    model_config, params, base_dir = trainer.base_policy(None)
  finally:
    trainer.writer.close()
  assert base_dir == str(workdir / "base_model")
  assert (model_config.param_dtype, model_config.dtype, model_config.remat, model_config.scan_layers) == (
      "bfloat16", "bfloat16", "full", True)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jax.numpy.dtype(jax.numpy.bfloat16)}
