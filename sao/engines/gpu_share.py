"""How the trainer and the local engines of one run share a GPU host's memory, decided before JAX starts in each.

JAX's GPU client takes 75 % of each GPU's memory when it starts (`XLA_PYTHON_CLIENT_PREALLOCATE`, default true;
`XLA_PYTHON_CLIENT_MEM_FRACTION`, default 0.75). In the README's embedded run the trainer and `num_engines` local
engine processes (`python -m sao.engines.serve`) each start a GPU client on the same device(s): the first takes 75 %,
the next asks for 75 % of the same memory. So when they share a GPU each process gets, in its own environment
before JAX starts:

    XLA_PYTHON_CLIENT_PREALLOCATE=false          memory is taken as the programs need it
    XLA_PYTHON_CLIENT_MEM_FRACTION=<its share>   and at most this fraction of each device
        trainer: TRAINER_FRACTION (0.70); each engine: ENGINES_FRACTION / num_engines (0.25 in all)

leaving 5 % to the CUDA contexts and cuDNN's workspaces, which live outside JAX's allocator. Engine i also sees
only the (i mod n)-th of the host's n visible GPUs (`CUDA_VISIBLE_DEVICES`), where the trainer's mesh spans them all. A value the user set
(either variable) is kept; one `apply` set (`SAO_GPU_SHARE_SET` names them) is the trainer's, which its engines
inherit and replace with their own. Nothing is set on a host whose JAX runs on CPU (`JAX_PLATFORMS` names cpu first, or the
host exposes no `/dev/nvidia<n>`), nor when no local engine runs (a trainer alone, external engine URLs).
No JAX import here: the variables only work when set before JAX creates its GPU client.
"""
from __future__ import annotations

import glob
import os
from typing import Mapping, MutableMapping

PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
VISIBLE = "CUDA_VISIBLE_DEVICES"
GPU_DEVICE_GLOBS = ("/dev/nvidia[0-9]*",)
GPU_PLATFORMS = ("cuda", "gpu", "rocm")
# Names the variables `apply` set (not the user): a child's share replaces its parent's inherited one.
SET_BY_US = "SAO_GPU_SHARE_SET"
TRAINER_FRACTION = 0.70
ENGINES_FRACTION = 0.25


def uses_gpu(env: Mapping[str, str] | None = None, device_globs: tuple[str, ...] = GPU_DEVICE_GLOBS) -> bool:
  """Whether JAX in a process with environment `env` (default: this one's) would run on a GPU: `JAX_PLATFORMS`
  names a GPU platform first, or it is unset and the host exposes GPU device files."""
  env = os.environ if env is None else env
  platforms = [p.strip() for p in env.get("JAX_PLATFORMS", "").split(",") if p.strip()]
  if platforms:
    return platforms[0] in GPU_PLATFORMS
  return any(glob.glob(pattern) for pattern in device_globs)


def memory_env(role: str, num_engines: int, env: Mapping[str, str] | None = None,
               device_globs: tuple[str, ...] = GPU_DEVICE_GLOBS, engine_index: int = 0) -> dict[str, str]:
  """The variables to add to the environment `env` of a `role` ("trainer" or "engine") process that shares the
  GPU with `num_engines` local engines (module docstring); {} when nothing is to be set. An engine also sees one GPU
  only (`CUDA_VISIBLE_DEVICES`): engine i the (i mod n)-th of the n visible ones, so that it neither opens a context
  on every GPU of the host nor computes on another engine's."""
  if role not in ("trainer", "engine"):
    raise ValueError(f"gpu_share: role must be 'trainer' or 'engine', got {role!r}")
  env = os.environ if env is None else env
  if num_engines < 1 or not uses_gpu(env, device_globs):
    return {}
  fraction = TRAINER_FRACTION if role == "trainer" else ENGINES_FRACTION / num_engines
  wanted = {PREALLOCATE: "false", FRACTION: f"{fraction:.3f}"}
  ours = set(env.get(SET_BY_US, "").split(","))  # the trainer's own shares, which its engines inherit
  added = {k: v for k, v in wanted.items() if k not in env or k in ours}
  visible = [d for d in env.get(VISIBLE, "").split(",") if d.strip()] or [str(i) for i in range(gpu_count(device_globs))]
  if role == "engine" and visible:
    added[VISIBLE] = visible[engine_index % len(visible)]
  return added


def gpu_count(device_globs: tuple[str, ...] = GPU_DEVICE_GLOBS) -> int:
  """GPU device files on this host (`/dev/nvidia<n>`)."""
  return sum(len(glob.glob(pattern)) for pattern in device_globs)


def apply(role: str, num_engines: int, env: MutableMapping[str, str] | None = None,
          device_globs: tuple[str, ...] = GPU_DEVICE_GLOBS, engine_index: int = 0) -> dict[str, str]:
  """Adds `memory_env(...)` to `env` (default: this process's environment); returns what it added."""
  env = os.environ if env is None else env
  added = memory_env(role, num_engines, env, device_globs, engine_index)
  env.update(added)
  if added:
    env[SET_BY_US] = ",".join(sorted(set(env.get(SET_BY_US, "").split(",")) - {""} | set(added)))
  return added
