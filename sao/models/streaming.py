"""Streaming HF safetensors loads: every tensor goes straight into its sharded device array, one at a time.

`load_pretrained_sharded(directory, sharding)` returns the same (config, params) as `sao.models.hf.load_pretrained`
(the host-numpy oracle) but builds each param with `jax.make_array_from_callback`: the callback of a device reads
only the region of the checkpoint that device's shard needs, converts it to the param dtype and hands it over. Peak
host memory is about one tensor (the shards of one param, deduplicated when replicated) plus one read chunk
(`_CHUNK_BYTES`), not the model.

Reading. Tensors are read with `os.pread` at offsets taken from the safetensors header (8-byte little-endian header
length, JSON header, then the C-order tensor bytes), not through `safetensors.safe_open`: that one memory-maps the
file, and every page a slice touches stays resident (and counted in the process's RSS) until the file is closed, so
streaming a shard file through one open handle would still grow RSS to the file's size.
Bytes are read straight into their destination (`preadv`), and each param's host array starts 64-byte aligned, which
XLA's CPU client takes over as the device buffer without a copy (`docs/performance_rollout.md`, "Weight publication").

Slicing commutes with every mapping of `sao.models.hf.RULES`, so no tensor is ever loaded whole. Our linear kernels
are stored in HF's layout, so a linear param is its HF tensor's bytes in the same order. With a param shard
`p[a₀:b₀, a₁:b₁, …]`:
  COPY     reads `w[a₀:b₀, a₁:b₁, …]`
  FLAT     ours `[H, D]` = `w.reshape(H, D)`: reads `w[a₀·D : b₀·D]`, then takes `[:, a₁:b₁]`
  LINEAR   ours `[out..., in]` = `w.reshape(…)`, `w [Π out, in]`: reads the box `p[a₀:b₀, …]` of the reshaped tensor
  LINEAR2  the same with two input dims (`[E, H, D]` ↔ `[E, H·D]`)
  EXPERT   experts `a₀:b₀` one by one, each the box of its own tensor `[out, in]` — or of a window of the fused
           `gate_up_proj [X, 2I, E]` / `down_proj [X, E, I]` tensor (at expert e, rows offset by I for `up`)
  CONV     ours `[K, C]` = `w[:, 0, :].T`: reads `w[a_C:b_C, 0:1, a_K:b_K]`
A box whose rows are whole (an unsharded param, or one sharded on its first dim) is read with `preadv` straight
into the param's host array; rows a shard does not need are read only when a C-order row is shorter than one read
chunk (whole rows are read and sliced in numpy, which bounds the number of system calls).

All names, shapes and dtypes are checked from the headers before any device memory is filled; the errors are
`load_pretrained`'s (unknown / missing / mis-shaped tensors, named).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import ml_dtypes
import numpy as np
from absl import logging
from jax.sharding import Mesh, Sharding, SingleDeviceSharding

from sao.models import hf
from sao.models import sharding as sharding_lib
from sao.models.config import ModelConfig
from sao.models.transformer import abstract_params

_CHUNK_BYTES = 4 * 1024 ** 2
_TILE = 64  # elements per side of `tiled_copy`'s tiles (measured best of 32-256)
_ALIGN = 64  # bytes; what XLA's CPU client needs to alias a host buffer
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
           "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}

Bounds = tuple[tuple[int, int], ...]  # (start, stop) per dim


# ------------------------------------------------------------------------------------------------ reading
@dataclasses.dataclass(frozen=True)
class StoredTensor:
  """One tensor of a safetensors file: its C-order bytes start at absolute byte `offset` of `file`."""
  file: str
  name: str
  dtype: np.dtype
  shape: tuple[int, ...]
  offset: int


def read_header(path: str) -> dict[str, StoredTensor]:
  """The tensors of one safetensors file by name (header only; no tensor data is read). Raises ValueError."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    length = int.from_bytes(head, "little")
    if length > size - 8:
      raise ValueError(f"{path}: header length {length} exceeds the file size {size}")
    try:
      header = json.loads(f.read(length))
    except ValueError as e:
      raise ValueError(f"{path}: the safetensors header is not JSON ({e})") from e
  if not isinstance(header, dict):
    raise ValueError(f"{path}: the safetensors header is not a JSON object")
  start = 8 + length
  out = {}
  for name in sorted(k for k in header if k != "__metadata__"):
    entry = header[name]
    try:
      dtype_name, shape, (begin, end) = entry["dtype"], tuple(int(n) for n in entry["shape"]), entry["data_offsets"]
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"{path}: tensor {name}: malformed header entry {entry!r}") from e
    if dtype_name not in _DTYPES:
      raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype_name}")
    dtype = np.dtype(_DTYPES[dtype_name])
    if end - begin != int(np.prod(shape)) * dtype.itemsize or start + end > size:
      raise ValueError(f"{path}: tensor {name}: data_offsets {begin}..{end} do not hold {shape} {dtype} in a file "
                       f"of {size} bytes")
    out[name] = StoredTensor(path, name, dtype, shape, start + begin)
  return out


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
  """`np.empty(shape, dtype)` starting at a multiple of `_ALIGN` bytes: a CPU device takes such a buffer over without
  a copy (an unaligned one is copied, on a slow path: ≈ 1 GB/s measured)."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(nbytes + _ALIGN, np.uint8)
  start = -raw.ctypes.data % _ALIGN
  return raw[start:start + nbytes].view(dtype).reshape(shape)


def tiled_copy(dst: np.ndarray, src: np.ndarray) -> None:
  """`dst[...] = src` for 2-D arrays, in `_TILE` × `_TILE` tiles: a transposed `src` is then read a few cache lines
  per row at a time, instead of one element per row along the whole of it (and rows whose stride is a multiple of
  the page size no longer evict each other). 1.3-4× faster than one `np.copyto` of a transpose (measured: 113 MB
  [576, 49152] → 318 → 232 ms, 67 MB [2048, 8192] → 444 → 111 ms)."""
  if src.dtype == dst.dtype and src.dtype.kind == "V":
    # Same-type copies of ml_dtypes' types (bfloat16, float8) as unsigned ints of their width: numpy's own copy
    # loops, the same bits, about twice as fast as the custom type's element-wise copy.
    uint = np.dtype(f"uint{8 * src.dtype.itemsize}")
    dst, src = dst.view(uint), src.view(uint)
  rows, cols = src.shape
  if src.flags.c_contiguous or rows * cols <= _TILE * _TILE:
    np.copyto(dst, src, casting="unsafe")
    return
  for r in range(0, rows, _TILE):
    for c in range(0, cols, _TILE):
      np.copyto(dst[r:r + _TILE, c:c + _TILE], src[r:r + _TILE, c:c + _TILE], casting="unsafe")


def _pread_into(fd: int, out: np.ndarray, offset: int, what: str) -> None:
  """Fills C-contiguous `out` with the file's bytes at `offset`: read straight into it, no intermediate bytes."""
  view, done = memoryview(out.reshape(-1).view(np.uint8)), 0
  while done < len(view):  # a read returns at most ~2 GiB
    n = os.preadv(fd, [view[done:]], offset + done)
    if n <= 0:
      raise ValueError(f"{what}: file ends {len(view) - done} bytes early (truncated checkpoint?)")
    done += n


def _pread(fd: int, nbytes: int, offset: int, what: str) -> bytes:
  parts, done = [], 0
  while done < nbytes:  # pread returns at most ~2 GiB per call
    part = os.pread(fd, nbytes - done, offset + done)
    if not part:
      raise ValueError(f"{what}: file ends {nbytes - done} bytes early (truncated checkpoint?)")
    parts.append(part)
    done += len(part)
  return parts[0] if len(parts) == 1 else b"".join(parts)


def _read_box(fd: int, t: StoredTensor, offset: int, shape: tuple[int, ...], bounds: Bounds, out: np.ndarray,
              counter: list[int]) -> None:
  """Fills `out` with `stored[bounds]` of the C-order block of `shape` at `offset`, ≤ `_CHUNK_BYTES` per read."""
  if not shape:
    out[...] = np.frombuffer(_pread(fd, t.dtype.itemsize, offset, t.name), t.dtype)[0]
    counter[0] += t.dtype.itemsize
    return
  row = int(np.prod(shape[1:])) * t.dtype.itemsize
  (a, b), rest = bounds[0], bounds[1:]
  if row <= _CHUNK_BYTES or all(lo == 0 and hi == n for (lo, hi), n in zip(rest, shape[1:])):
    inner = tuple(slice(lo, hi) for lo, hi in rest)
    per = max(1, _CHUNK_BYTES // max(row, 1))
    whole_rows = all(lo == 0 and hi == n for (lo, hi), n in zip(rest, shape[1:]))
    for i in range(a, b, per):
      j = min(b, i + per)
      if whole_rows and out.flags.c_contiguous:
        _pread_into(fd, out[i - a:j - a], offset + i * row, t.name)
      else:
        block = np.frombuffer(_pread(fd, (j - i) * row, offset + i * row, t.name), t.dtype)
        out[i - a:j - a] = block.reshape((j - i,) + shape[1:])[(slice(None),) + inner]
      counter[0] += (j - i) * row
  else:  # a row is larger than a chunk and only part of it is needed: recurse into each row
    for i in range(a, b):
      _read_box(fd, t, offset + i * row, shape[1:], rest, out[i - a], counter)


@dataclasses.dataclass(frozen=True)
class _View:
  """A window of a stored tensor: `stored[lead…, row_offset : row_offset + shape[0], …]` (fused experts), or the
  whole tensor (no lead, offset 0). `shape` is the HF tensor shape the rule expects."""
  tensor: StoredTensor
  shape: tuple[int, ...]
  lead: tuple[int, ...] = ()
  row_offset: int = 0

  def read(self, bounds: Bounds, counter: list[int], scratch: np.ndarray | None = None) -> np.ndarray:
    """`view[bounds]` in the stored dtype (aligned; in `scratch`'s memory if given and large enough)."""
    t = self.tensor
    stored = tuple((e, e + 1) for e in self.lead)
    if bounds:
      (a, b), rest = bounds[0], bounds[1:]
      stored += ((self.row_offset + a, self.row_offset + b),) + tuple(rest)
    shape = tuple(hi - lo for lo, hi in stored)
    nbytes = int(np.prod(shape, dtype=np.int64)) * t.dtype.itemsize
    if scratch is not None and scratch.nbytes >= nbytes:
      out = scratch[:nbytes].view(t.dtype).reshape(shape)
    else:
      out = aligned_empty(shape, t.dtype)
    fd = os.open(t.file, os.O_RDONLY)
    try:
      _read_box(fd, t, t.offset, t.shape, stored, out, counter)
    finally:
      os.close(fd)
    return out.reshape(tuple(hi - lo for lo, hi in bounds))


# ------------------------------------------------------------------------------------------------ mapping
def _in_param_shape(view: _View, shape: tuple[int, ...]) -> _View:
  """A whole HF tensor `[Π out, Π in]` seen as the param `[out..., in...]` it is, reshaped (the same C-order bytes:
  our linear kernels are stored in HF's layout)."""
  if view.lead or view.row_offset or view.shape != view.tensor.shape:
    raise ValueError(f"{view.tensor.name}: a window of a fused tensor where a whole linear weight was expected")
  return _View(dataclasses.replace(view.tensor, shape=tuple(shape)), tuple(shape))


def _read_as(view: _View, bounds: Bounds, dtype: np.dtype, counter: list[int],
             out: np.ndarray | None = None) -> np.ndarray:
  """`view[bounds]` in `dtype`, C-contiguous: read straight into `out` (given, C-contiguous) when the dtypes match,
  else read and converted in one copy."""
  if out is not None and out.dtype == view.tensor.dtype:
    view.read(bounds, counter, out.reshape(-1).view(np.uint8))
    return out
  w = view.read(bounds, counter)
  if out is None:
    return _contiguous(w, dtype)
  np.copyto(out, w, casting="unsafe")
  return out


def _param_slice(kind: str, views: dict[int | None, _View], shape: tuple[int, ...], bounds: Bounds,
                 dtype: np.dtype, counter: list[int]) -> np.ndarray:
  """`param[bounds]` in `dtype`, C-contiguous (see the module docstring's table)."""
  if kind == hf.EXPERT:  # expert e's slice is its HF tensor (or a window of the fused one) as it is stored
    (x0, x1), rest = bounds[0], bounds[1:]
    out = aligned_empty((x1 - x0,) + tuple(hi - lo for lo, hi in rest), dtype)
    for e in range(x0, x1):
      _read_as(views[e], rest, dtype, counter, out[e - x0])
    return out
  view = views[None]
  if kind in (hf.LINEAR, hf.LINEAR2):
    return _read_as(_in_param_shape(view, shape), bounds, dtype, counter)
  if kind == hf.COPY:
    w = view.read(bounds, counter)
  elif kind == hf.FLAT:
    inner = int(np.prod(shape[1:]))
    (a, b), rest = bounds[0], bounds[1:]
    w = view.read(((a * inner, b * inner),), counter).reshape((b - a,) + shape[1:])
    w = w[(slice(None),) + tuple(slice(lo, hi) for lo, hi in rest)]
  elif kind == hf.CONV:
    (k0, k1), (c0, c1) = bounds
    w = view.read(((c0, c1), (0, 1), (k0, k1)), counter)[:, 0, :].T
  else:
    raise ValueError(f"transform {kind!r}: unknown")
  return _contiguous(w, dtype)


def _contiguous(w: np.ndarray, dtype: np.dtype) -> np.ndarray:
  """`w` as an aligned C-contiguous array of `dtype`: `w` itself when it is one already, else one copy."""
  if w.dtype == dtype and w.flags.c_contiguous and w.ctypes.data % _ALIGN == 0:
    return w
  out = aligned_empty(w.shape, dtype)
  np.copyto(out, w, casting="unsafe")
  return out


def _fused_expert_views(name: str, t: StoredTensor) -> list[tuple[str, _View]] | None:
  """Fused expert tensors → per-expert HF names (as `hf._split_fused_experts`, without reading data)."""
  match = hf._FUSED_EXPERTS.match(name)
  if match is None:
    return None
  if len(t.shape) != 3:
    raise ValueError(f"{name}: shape {t.shape}, expected a stacked [experts, out, in] tensor")
  layer, kind = match.groups()
  base = f"model.layers.{layer}.mlp.experts"
  x, rows, cols = t.shape
  if kind == "down_proj":
    return [(f"{base}.{e}.down_proj.weight", _View(t, (rows, cols), (e,))) for e in range(x)]
  half = rows // 2
  return ([(f"{base}.{e}.gate_proj.weight", _View(t, (half, cols), (e,))) for e in range(x)]
          + [(f"{base}.{e}.up_proj.weight", _View(t, (rows - half, cols), (e,), half)) for e in range(x)])


def _iter_views(directory: str):
  """(normalised HF name, view) of every tensor we model, from the headers; logs what is skipped."""
  skipped: dict[str, int] = {}
  for path in hf._safetensors_files(directory):
    for name, t in read_header(path).items():
      prefix = next((p for p in hf._SKIPPED_PREFIXES if name.startswith(p)), None)
      if prefix is not None:
        skipped[prefix] = skipped.get(prefix, 0) + 1
        continue
      hf_name = name
      for alias, canonical in hf._PREFIX_ALIASES:
        if name.startswith(alias):
          hf_name = canonical + name[len(alias):]
      yield from _fused_expert_views(hf_name, t) or [(hf_name, _View(t, t.shape))]
  if skipped:
    logging.info("%s: skipped %s (not part of the language model)", directory,
                 ", ".join(f"{n} tensors {p}*" for p, n in sorted(skipped.items())))


def plan_load(directory: str, config: ModelConfig, critic: bool = False
              ) -> dict[str, tuple[str, dict[int | None, _View], tuple[int, ...]]]:
  """param path → (transform, views by expert index (None: the one tensor), param shape), from the headers only.
  Raises `load_pretrained`'s ValueErrors for unknown, missing or mis-shaped tensors."""
  expected = {path: leaf.shape for path, leaf in hf._flatten(nn.meta.unbox(abstract_params(config, critic))).items()}
  plan: dict[str, tuple[str, dict[int | None, _View], tuple[int, ...]]] = {}
  unknown = []
  for name, view in _iter_views(directory):
    if name == "lm_head.weight" and config.tie_word_embeddings and not critic:
      continue  # some tied checkpoints still store the (identical) head
    found = hf.hf_to_path(name)
    if found is None or found[0] not in expected:
      unknown.append(name)
      continue
    path, kind, expert = found
    shape = expected[path]
    if kind == hf.EXPERT and expert >= shape[0]:
      unknown.append(name)
      continue
    if view.shape != hf._hf_shape(kind, shape):
      raise ValueError(f"{name}: shape {view.shape}, expected {hf._hf_shape(kind, shape)} for param {path}")
    plan.setdefault(path, (kind, {}, shape))[1][expert] = view
  missing = [f"{p} (HF {hf._path_to_hf_name(p)})" for p in sorted(expected) if p not in plan]
  for path, (kind, views, shape) in plan.items():
    if kind == hf.EXPERT:
      missing += [f"{path}[expert {e}]" for e in range(shape[0]) if e not in views]
  if unknown or missing:
    raise ValueError(f"{directory} does not fit {config.model_type} (critic={critic}): "
                     f"unknown tensors {sorted(unknown)}; missing params {missing}")
  return plan


# ------------------------------------------------------------------------------------------------ loading
def _sharding_for(sharding: Any, config: ModelConfig, critic: bool) -> Callable[[str], Sharding]:
  if sharding is None:
    sharding = SingleDeviceSharding(jax.devices()[0])
  if isinstance(sharding, Mesh):
    sharding = sharding_lib.param_shardings(config, sharding, critic)
  if isinstance(sharding, Sharding):
    return lambda path: sharding
  flat = hf._flatten(sharding)
  return lambda path: flat[path]


def load_pretrained_sharded(directory: str, sharding: Mesh | Sharding | dict | None = None, dtype: str = "float32",
                            critic: bool = False, bytes_read: list[int] | None = None,
                            **config_overrides) -> tuple[ModelConfig, dict]:
  """`hf.load_pretrained` straight into device arrays, one tensor at a time (see the module docstring).

  sharding: a Mesh (each param sharded by `sao.models.sharding`'s rules), a tree of Shardings in the params' tree,
    one Sharding for every param, or None (the default device).
  bytes_read: if given, `bytes_read[0]` is increased by the checkpoint bytes read (the tests' memory probe).
  Returns (config, params): params equal `load_pretrained`'s leaf for leaf (same values and dtype), as jax Arrays
  with the given shardings. Raises ValueError (before any device memory is filled) as `load_pretrained` does.
  """
  overrides = {"dtype": dtype, "param_dtype": dtype, **config_overrides}
  config = ModelConfig.from_pretrained(directory, **overrides)
  param_dtype = np.dtype(ml_dtypes.bfloat16) if config.param_dtype == "bfloat16" else np.dtype(np.float32)
  plan = plan_load(directory, config, critic)
  sharding_of = _sharding_for(sharding, config, critic)
  counter = bytes_read if bytes_read is not None else [0]
  params = {}
  for path, (kind, views, shape) in plan.items():
    cache: dict[Bounds, np.ndarray] = {}  # replicated shards share one host array

    def callback(index: Sequence[slice], kind=kind, views=views, shape=shape, cache=cache) -> np.ndarray:
      bounds = tuple(s.indices(n)[:2] for s, n in zip(index, shape))
      if bounds not in cache:
        cache[bounds] = _param_slice(kind, views, shape, bounds, param_dtype, counter)
      return cache[bounds]

    params[path] = jax.make_array_from_callback(shape, sharding_of(path), callback, dtype=param_dtype)
    cache.clear()
  return config, hf._unflatten(params)
