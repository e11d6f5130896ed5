"""Harnesses by name, and the per-episode mixture that picks one (the mixed-harness experiment).

`HarnessMixture.pick` is deterministic in (seed, group id, sample index): a re-leased sample runs through the same
harness, and a run's harness sequence does not depend on which worker played what. Validation episodes always run
through `eval_harness`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import TypeVar

from sao.rollout.harnesses.base import Harness

_REGISTRY: dict[str, Harness] = {}

H = TypeVar("H", bound=type[Harness])


def register(cls: H) -> H:
  """Class decorator: registers one instance of `cls` under `cls.name`."""
  name = cls.name
  if name in _REGISTRY and type(_REGISTRY[name]) is not cls:
    raise ValueError(f"harness name {name!r} is already registered to {type(_REGISTRY[name]).__name__}")
  _REGISTRY[name] = cls()
  return cls


def get(name: str) -> Harness:
  if name not in _REGISTRY:
    raise KeyError(f"harness {name!r} is not registered; known: {sorted(_REGISTRY)}")
  return _REGISTRY[name]


def registered() -> list[str]:
  return sorted(_REGISTRY)


def stable_uniform(key: str) -> float:
  """A uniform number in [0, 1) from `key` (SHA-256, not Python's salted `hash`)."""
  return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


@dataclasses.dataclass(frozen=True)
class HarnessMixture:
  """Harness names with relative sampling weights (normalised here) and the validation harness.

  Attributes:
    names: registered harness names, at least one, no repeats.
    weights: one non-negative weight per name (empty: equal weights); their sum must be positive.
    eval_harness: the harness validation episodes run through ("" = `names[0]`).
    seed: the run's seed (a different seed gives a different, equally distributed assignment).
  """
  names: tuple[str, ...]
  weights: tuple[float, ...] = ()
  eval_harness: str = ""
  seed: int = 0

  def __post_init__(self):
    names = tuple(self.names)
    if not names:
      raise ValueError("harnesses: need at least one harness name")
    if len(set(names)) != len(names):
      raise ValueError(f"harnesses: repeated names in {names}")
    for name in names + ((self.eval_harness,) if self.eval_harness else ()):
      if name not in _REGISTRY:
        raise ValueError(f"harnesses: {name!r} is not a registered harness; known: {sorted(_REGISTRY)}")
    weights = tuple(float(w) for w in self.weights) or tuple(1.0 for _ in names)
    if len(weights) != len(names):
      raise ValueError(f"harness_weights: {len(weights)} weights for {len(names)} harnesses {names}")
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
      raise ValueError(f"harness_weights: must be finite, >= 0 and not all 0; got {weights}")
    object.__setattr__(self, "names", names)
    object.__setattr__(self, "weights", weights)
    object.__setattr__(self, "eval_harness", self.eval_harness or names[0])

  @property
  def probabilities(self) -> tuple[float, ...]:
    total = sum(self.weights)
    return tuple(w / total for w in self.weights)

  def pick(self, group_id: str, sample_index: int, is_validation: bool = False) -> str:
    """The harness of one episode (sample `sample_index` of lease group `group_id`)."""
    if is_validation:
      return self.eval_harness
    u = stable_uniform(f"harness:{self.seed}:{group_id}:{sample_index}")
    edge = 0.0
    for name, p in zip(self.names, self.probabilities):
      edge += p
      if u < edge:
        return name
    return next(n for n, w in zip(reversed(self.names), reversed(self.weights)) if w > 0)

