"""Policy export to an ordinary HF directory (config, safetensors, tokenizer) without the whole model on one host.

Every process of the job calls `export_policy` with the same (sharded) params; it is the one export path, the
single-process run being the case P = 1.

    plan        from shapes alone, identical on every process: each param gets an owner process (greedy by bytes,
                params in path order), each process's params go into its own safetensors file(s) (split above
                `max_shard_bytes`), every tensor's byte range in its file is fixed before any value is read
    gather      for each param in plan order: if its owner's devices hold every shard (one process; params
                replicated over a data axis spanning the hosts), the owner assembles it from its own shards; else all
                processes take part in resharding it so each process holds all of it, spread over its own devices
                (a collective; one copy per process, transiently), and the owner assembles it from its shards. The
                owner writes its HF tensors at their offsets: our linear kernels are stored in HF's layout, so they
                are the param's own bytes (`sao.models.hf.param_to_hf` is a reshape; only the small conv1d weight is
                transposed)
    finish      after a barrier, process 0 writes `config.json`, `model.safetensors.index.json` (more than one file)
                and the tokenizer, then renames `<directory>.tmp` to `<directory>` (engines never see a half-written
                directory); a last barrier, so no process returns before the directory exists

Host memory: one param at a time on its owner (on a CPU device a param one shard holds is read in place and written
from there; a transposed tensor goes through a reused ~1 MB block), never the model (measured: docs/tpu.md, "Multi-host
weight export"). Device memory: one copy of one param per process while it is gathered by the collective. The
directory must be on a filesystem every process sees (one machine, or NFS / a FUSE-mounted bucket on a pod). One
process and one file (≤ `max_shard_bytes`) gives `model.safetensors` with no index, as
`sao.models.hf.save_pretrained` writes.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import tempfile
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sao.models import hf, streaming
from sao.models.config import ModelConfig
from sao.models.tokenizer import Tokenizer
from sao.train import distributed

INDEX_FILE = "model.safetensors.index.json"
_BLOCK_BYTES = 1 << 20  # rows of a transposed tensor copied and written at a time
_TOKENIZER_FILES: "weakref.WeakKeyDictionary[Tokenizer, dict[str, bytes]]" = weakref.WeakKeyDictionary()
_SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64", "int32": "I32",
                       "int64": "I64"}


@dataclasses.dataclass
class _Tensor:
  name: str  # HF name
  shape: tuple[int, ...]
  dtype: np.dtype
  begin: int  # byte offset in its file's data section

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclasses.dataclass
class _File:
  name: str
  owner: int
  tensors: list[_Tensor] = dataclasses.field(default_factory=list)
  size: int = 0  # bytes of the data section

  def header(self) -> bytes:
    """The safetensors header: little-endian u64 length, then JSON padded with spaces to a multiple of 8."""
    entries = {t.name: {"dtype": _SAFETENSORS_DTYPES[t.dtype.name], "shape": list(t.shape),
                        "data_offsets": [t.begin, t.begin + t.nbytes]} for t in self.tensors}
    entries["__metadata__"] = {"format": "pt"}  # transformers refuses safetensors without a known format tag
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


@dataclasses.dataclass
class ExportPlan:
  """Where every param goes: `owners[path]` (process), `file_of[path]` (index into `files`)."""
  files: list[_File]
  owners: dict[str, int]
  file_of: dict[str, int]


def plan_export(shapes: dict[str, tuple[tuple[int, ...], np.dtype]], num_processes: int,
                max_shard_bytes: int) -> ExportPlan:
  """Lays out `{param path: (shape, dtype)}` over `num_processes` writers. Deterministic in its arguments."""
  if num_processes < 1 or max_shard_bytes < 1:
    raise ValueError(f"export: num_processes={num_processes} and max_shard_bytes={max_shard_bytes} must be >= 1")
  load = [0] * num_processes
  owners, by_process = {}, [[] for _ in range(num_processes)]
  for path in sorted(shapes):
    shape, dtype = shapes[path]
    if np.dtype(dtype).name not in _SAFETENSORS_DTYPES:
      raise ValueError(f"export: param {path!r} has dtype {np.dtype(dtype).name}, which safetensors export does not "
                       f"support (supported: {sorted(_SAFETENSORS_DTYPES)})")
    owner = int(np.argmin(load))
    owners[path] = owner
    by_process[owner].append(path)
    load[owner] += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
  files, file_of = [], {}
  for process, paths in enumerate(by_process):
    current = None
    for path in paths:
      shape, dtype = shapes[path]
      specs = hf.hf_tensor_specs(path, shape)
      nbytes = sum(int(np.prod(s, dtype=np.int64)) for _, s in specs) * np.dtype(dtype).itemsize
      if current is None or (current.tensors and current.size + nbytes > max_shard_bytes):
        current = _File("", process)
        files.append(current)
      for name, hf_shape in specs:
        current.tensors.append(_Tensor(name, tuple(hf_shape), np.dtype(dtype), current.size))
        current.size += current.tensors[-1].nbytes
      file_of[path] = len(files) - 1
  for i, f in enumerate(files):
    f.name = "model.safetensors" if len(files) == 1 else f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
  return ExportPlan(files, owners, file_of)


def _gather_sharding(x: jax.Array) -> NamedSharding:
  """A sharding of `x`'s devices in which every process holds all of `x`, spread over its own devices (the first
  dimension their number divides; replicated over them if none does): a whole copy per process, not per device."""
  devices = sorted(x.sharding.device_set, key=lambda d: (d.process_index, d.id))
  per_process = len(devices) // len({d.process_index for d in devices})
  mesh = Mesh(np.asarray(devices).reshape(-1, per_process), ("processes", "local"))
  dim = next((i for i, n in enumerate(x.shape) if n % per_process == 0), None)
  spec = [None] * x.ndim
  if dim is not None:
    spec[dim] = "local"
  return NamedSharding(mesh, PartitionSpec(*spec))


def _index_key(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
  return tuple(s.indices(n) for s, n in zip(index, shape))


def _process_holds_all(x: jax.Array, process: int) -> bool:
  """Whether `process`'s devices hold every distinct shard of `x` (e.g. params replicated over a data axis that
  spans the hosts). Computed from the sharding alone: the same answer on every process."""
  indices = x.sharding.devices_indices_map(x.shape)
  every = {_index_key(i, x.shape) for i in indices.values()}
  return every == {_index_key(i, x.shape) for d, i in indices.items() if d.process_index == process}


class _BufferOf:
  """The bytes of a CPU device array's own buffer, for numpy (`__array_interface__`): the numpy array made from it
  holds this object, which holds the jax array, so the buffer lives as long as any view of it."""

  def __init__(self, x: jax.Array):
    # The pointer is taken at once, the computation that writes the buffer may still be running (async dispatch):
    # wait for it, or the view reads whatever the memory held (a freshly initialised policy exported as garbage).
    self.owner = x.block_until_ready()
    self.__array_interface__ = {"shape": (x.size * x.dtype.itemsize,), "typestr": "|u1", "version": 3,
                                "data": (x.unsafe_buffer_pointer(), True)}


def _row_major(x: jax.Array) -> bool:
  layout = getattr(getattr(x, "format", None), "layout", None)
  return (layout is not None and tuple(layout.major_to_minor) == tuple(range(x.ndim))
          and not tuple(getattr(layout, "tiling", ()) or ()))


def _host_copy(x: jax.Array) -> np.ndarray:
  """A host value of single-device `x` that nothing keeps. `np.asarray` caches the host value it copies on the array
  it converts, for that array's lifetime, and the params outlive the export; so it converts a device-side copy. On
  a CPU device the buffer is host memory already: it is viewed in place, read-only, no copy at all (any dtype;
  numpy's DLPack has no bfloat16), when its layout is the default row-major one."""
  if x.size and all(d.platform == "cpu" for d in x.devices()) and _row_major(x):
    view = np.asarray(_BufferOf(x)).view(x.dtype).reshape(x.shape)
    view.flags.writeable = False
    return view
  return np.asarray(jnp.copy(x))


def _assemble(x: jax.Array) -> np.ndarray:
  """The full value of `x` from this process's shards (no host copy besides the transfer when one shard holds all
  of it: one device, or replicated)."""
  shards, done = [], set()
  for shard in x.addressable_shards:
    key = _index_key(shard.index, x.shape)
    if key not in done:
      done.add(key)
      shards.append(shard)
  if len(shards) == 1 and shards[0].data.shape == x.shape:
    return _host_copy(shards[0].data)
  out = np.empty(x.shape, x.dtype)
  for shard in shards:
    out[shard.index] = _host_copy(shard.data)
  return out


def _host_value(x: Any, owner: int, process: int) -> np.ndarray | None:
  """The full value of one param on its `owner` (None elsewhere). A collective when the owner's devices lack a
  shard of `x`: every process calls it for every param, in the same order."""
  if not isinstance(x, jax.Array):
    return np.asarray(x) if owner == process else None
  if x.is_fully_addressable or _process_holds_all(x, owner):
    return _assemble(x) if owner == process else None
  # `device_put` between meshes of one device set (in another order) is a collective resharding. The copy is
  # dropped on return; every process waits for it: dispatch is asynchronous, and a process that owns nothing would
  # otherwise queue the next params' gathers, each holding a copy.
  copy = jax.device_put(x, _gather_sharding(x)).block_until_ready()
  return _assemble(copy) if owner == process else None


def _hf_views(param_path: str, value: np.ndarray) -> list[tuple[str, np.ndarray]]:
  """`hf.param_to_hf` without its copies: the HF tensors as (name, view of `value`), in `hf_tensor_specs` order."""
  template, kind, groups = hf._path_rule(param_path)  # pylint: disable=protected-access
  if kind == hf.EXPERT:
    return [(template.format(expert=e, **groups), value[e]) for e in range(value.shape[0])]
  return [(template.format(**groups), hf._to_hf(value, kind))]  # pylint: disable=protected-access


class _Writer:
  """Writes tensors at their planned offsets through one open handle per file. A tensor that is a strided view (a
  transpose) goes through a reused scratch buffer in row blocks of about `_BLOCK_BYTES`: no whole transposed copy
  is allocated per tensor (fresh pages cost as much as the copy itself)."""

  def __init__(self):
    self.handles: dict[str, Any] = {}
    self.scratch = np.empty(0, np.uint8)

  def write(self, path: str, offset: int, array: np.ndarray) -> None:
    f = self.handles.get(path)
    if f is None:
      f = self.handles[path] = open(path, "r+b")  # pylint: disable=consider-using-with
    f.seek(offset)
    if array.flags.c_contiguous:
      f.write(memoryview(array.reshape(-1).view(np.uint8)))
      return
    rows = array.reshape((array.shape[0], -1)) if array.ndim > 1 else array.reshape((-1, 1))
    row_bytes = rows.shape[1] * rows.dtype.itemsize
    per = max(1, _BLOCK_BYTES // max(row_bytes, 1))
    if self.scratch.nbytes < per * row_bytes:
      self.scratch = np.empty(per * row_bytes, np.uint8)
    for r in range(0, rows.shape[0], per):
      n = min(per, rows.shape[0] - r)
      block = self.scratch[:n * row_bytes].view(rows.dtype).reshape(n, rows.shape[1])
      streaming.tiled_copy(block, rows[r:r + n])
      f.write(memoryview(block.reshape(-1).view(np.uint8)))

  def close(self) -> None:
    for f in self.handles.values():
      f.close()
    self.handles.clear()


def _write_tensors(writer: _Writer, path: str, file: _File, header_len: int, param_path: str,
                   value: np.ndarray) -> None:
  """Writes one param's HF tensors at their planned offsets in `file` (already sized)."""
  offsets = {t.name: t for t in file.tensors}
  for name, array in _hf_views(param_path, value):
    tensor = offsets[name]
    if tuple(array.shape) != tensor.shape or array.dtype != tensor.dtype:
      raise ValueError(f"export: {name} is {array.shape} {array.dtype}, planned {tensor.shape} {tensor.dtype}")
    writer.write(path, header_len + tensor.begin, array)


def _tokenizer_files(tokenizer: Tokenizer) -> dict[str, bytes]:
  """The files `tokenizer.save_pretrained` writes, by name; serialised once per tokenizer object (a `Tokenizer` is
  not changed after it is built), not once per policy version."""
  files = _TOKENIZER_FILES.get(tokenizer)
  if files is None:
    with tempfile.TemporaryDirectory() as scratch:
      tokenizer.save_pretrained(scratch)
      files = {}
      for name in sorted(os.listdir(scratch)):
        with open(os.path.join(scratch, name), "rb") as f:
          files[name] = f.read()
    _TOKENIZER_FILES[tokenizer] = files
  return files


def export_policy(model_config: ModelConfig, params: Any, tokenizer: Tokenizer | None, directory: str,
                  max_shard_bytes: int = 4 * 1024 ** 3) -> str:
  """Writes `params` (a policy or critic tree: host arrays, device arrays, or global arrays spanning processes) as
  an HF directory at `directory` (replaced if present) and returns it. Every process must call it with the same
  arguments (see the module docstring); the tokenizer (if given), config and index are written by process 0."""
  directory = os.path.abspath(directory)
  tmp = directory + ".tmp"
  process, num_processes = jax.process_index(), jax.process_count()
  flat = hf.flat_params(params)
  plan = plan_export({p: (tuple(np.shape(x)), np.dtype(x.dtype)) for p, x in flat.items()}, num_processes,
                     max_shard_bytes)
  if distributed.is_coordinator():
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
  distributed.barrier(f"export {directory}: begin")
  header_lens = {}
  for i, f in enumerate(plan.files):
    if f.owner == process:  # the whole file, sized up front: tensors land at their offsets in any order
      header = f.header()
      header_lens[i] = len(header)
      with open(os.path.join(tmp, f.name), "wb") as out:
        out.write(header)
        out.truncate(len(header) + f.size)
  writer = _Writer()
  try:
    for path in sorted(flat):
      owner = plan.owners[path]
      value = _host_value(flat[path], owner, process)
      if value is not None:
        index = plan.file_of[path]
        file = plan.files[index]
        _write_tensors(writer, os.path.join(tmp, file.name), file, header_lens[index], path, value)
      del value  # one param on the host at a time
  finally:
    writer.close()
  distributed.barrier(f"export {directory}: tensors written")
  if distributed.is_coordinator():
    dtypes = {t.dtype.name for f in plan.files for t in f.tensors}
    critic = any(t.name == "score.weight" for f in plan.files for t in f.tensors)
    with open(os.path.join(tmp, "config.json"), "w") as out:
      json.dump(hf.hf_config_json(model_config, dtypes, critic), out, indent=2, sort_keys=True)
    if len(plan.files) > 1:
      weight_map = {t.name: f.name for f in plan.files for t in f.tensors}
      total = sum(f.size for f in plan.files)
      with open(os.path.join(tmp, INDEX_FILE), "w") as out:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, out, indent=2, sort_keys=True)
    if tokenizer is not None:
      for name, data in _tokenizer_files(tokenizer).items():
        with open(os.path.join(tmp, name), "wb") as out:
          out.write(data)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)  # engines never see a half-written directory
  distributed.barrier(f"export {directory}: done")
  return directory
