"""TPU chips and topologies for ahead-of-time compilation: the chip facts, and a topology name → its devices.

`topology_devices("v5p:4x4x8")` returns the 128 devices of a v5p-128 slice from libtpu
(`jax.experimental.topologies.get_topology_desc`) on any machine, no TPU needed: jit can lower and compile for
them, nothing can run on them. One device per chip (v4 and v5p chips have two TensorCores, addressed as one
"megacore" device, as MaxText's `accelerator_to_spec_map.py` does).

Chip facts (`CHIPS`), from the Google Cloud TPU documentation pages "TPU v4", "TPU v5e", "TPU v5p" and "TPU v6e"
(cloud.google.com/tpu/docs/v4, …/v5e, …/v5p, …/v6e): "Peak compute per chip (bf16)", "HBM capacity per chip" and
"HBM bandwidth per chip" (the pages write GB for capacity; the chips hold that many GiB: libtpu's compiler allows
95.74 GiB of a v5p chip's 96 GiB).

ICI (`ici_bytes_per_second`, `ici_links`): "Bidirectional inter-chip interconnect (ICI) bandwidth (per chip)" and "ICI
ports per chip" of the same pages (v5p: 1200 GBps over the 6 links of its 3D torus; v5e: 400 GBps, 4 ports; v6e:
800 GBps, 4 ports). The v4 page gives no per-chip ICI figure: 6 links of 45 GB/s each way, from "How to Scale Your
Model" (Austin et al. 2025, jax-ml.github.io/scaling-book/tpus, the ICI table), i.e. 540 GB/s bidirectional.
`ici_ring_bytes_per_second` is what `sao.aot.hlo_cost` prices a collective with: a bidirectional ring over one
torus axis sends on two links at once, `2 · ici_bytes_per_second / (2 · ici_links)` per chip (a group spanning
several axes may use more links; the ring is the conservative model).
"""
from __future__ import annotations

import dataclasses
import os
import re

import jax

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str  # the topology prefix: "v5p" in "v5p:4x4x8"
  device_kind: str  # jax's `device.device_kind` for this chip
  hbm_bytes: int  # HBM per chip
  peak_bf16_flops: float  # peak dense bf16 FLOP/s per chip
  hbm_bytes_per_second: float  # HBM bandwidth per chip
  chip_config_name: str  # libtpu's name for one device per chip
  ici_bytes_per_second: float = 0.0  # ICI bandwidth per chip, all links, both directions
  ici_links: int = 0  # ICI ports per chip

  @property
  def ici_ring_bytes_per_second(self) -> float:
    """Per-chip bandwidth of a bidirectional ring collective over one torus axis (two links, each one way)."""
    if not self.ici_bytes_per_second or not self.ici_links:
      raise ValueError(f"chip {self.name}: no ICI bandwidth in its Chip entry")
    return self.ici_bytes_per_second / self.ici_links


CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", "TPU v4", 32 * GIB, 275e12, 1200e9, "megacore", 540e9, 6),
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GIB, 197e12, 819e9, "default", 400e9, 4),
    "v5p": Chip("v5p", "TPU v5", 95 * GIB, 459e12, 2765e9, "megacore", 1200e9, 6),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GIB, 918e12, 1640e9, "default", 800e9, 4),
}

# GPUs the accelerator check runs on, for pricing their compiled programs with the same cost model (`hlo_cost`):
# the vendor's dense bf16 peak (no sparsity) and HBM bandwidth; NVLink's 900 GB/s over 18 links.
GPUS: dict[str, Chip] = {
    "h200": Chip("h200", "NVIDIA H200", 141 * 10**9, 989e12, 4.8e12, "", 900e9, 18),
    "h100": Chip("h100", "NVIDIA H100 80GB HBM3", 80 * 10**9, 989e12, 3.35e12, "", 900e9, 18),
}


def chip_named(name: str) -> Chip:
  """A TPU chip (`CHIPS`) or a GPU (`GPUS`) by its short name; ValueError naming the known ones otherwise."""
  if name in CHIPS:
    return CHIPS[name]
  if name in GPUS:
    return GPUS[name]
  raise ValueError(f"chip: unknown {name!r}; expected one of {sorted(CHIPS) + sorted(GPUS)}")


_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$")


def parse_topology(name: str) -> tuple[Chip, tuple[int, ...]]:
  """`"v5p:4x4x8"` → (the v5p chip, (4, 4, 8)); ValueError naming the problem otherwise."""
  match = _TOPOLOGY.match(name)
  if not match:
    raise ValueError(f"topology: {name!r} is not <chip>:<AxB[xC]> with chip one of {sorted(CHIPS)} "
                     "(e.g. v5p:4x4x8 for a v5p-128, v6e:16x16 for a v6e-256)")
  return CHIPS[match.group(1)], tuple(int(d) for d in match.group(2).split("x"))


def topology_devices(name: str) -> tuple[Chip, list[jax.Device]]:
  """The chip and the devices (one per chip) of a TPU topology. Needs libtpu (`pip install "jax[tpu]"`)."""
  chip, dims = parse_topology(name)
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  # libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) so that two processes never drive one TPU; compiling
  # drives none, and two compiles (a test and its subprocess, two reports) must be able to run side by side.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    description = topologies.get_topology_desc(platform="tpu", topology_name=name,
                                                chip_config_name=chip.chip_config_name)
  except Exception as e:  # libtpu missing, or a shape libtpu rejects: say which, keep the cause
    raise ValueError(f"topology: libtpu could not describe {name!r} ({type(e).__name__}: {e}); ahead-of-time "
                     "compilation needs libtpu: pip install -e '.[test]' or pip install 'jax[tpu]'") from e
  devices = list(description.devices)
  chips = 1
  for d in dims:
    chips *= d
  if len(devices) != chips:
    raise ValueError(f"topology: {name!r} should have {chips} chips, libtpu returned {len(devices)} devices")
  return chip, devices
