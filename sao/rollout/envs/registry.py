"""Environments by name, so configs and leased tasks (`task["env"]`) can name them."""
from __future__ import annotations

from typing import Any, Callable, TypeVar

from sao.rollout.envs.base import Env

_REGISTRY: dict[str, Callable[..., Env]] = {}

E = TypeVar("E", bound=type[Env])


def register(name: str) -> Callable[[E], E]:
  """Class decorator: `@register("number_search")` makes `make("number_search", **config)` build it."""

  def wrap(cls: E) -> E:
    if name in _REGISTRY and _REGISTRY[name] is not cls:
      raise ValueError(f"env name {name!r} is already registered to {_REGISTRY[name].__name__}")
    _REGISTRY[name] = cls
    return cls

  return wrap


def make(name: str, **kwargs: Any) -> Env:
  """A new environment instance; `kwargs` are the environment's configuration."""
  if name not in _REGISTRY:
    raise KeyError(f"env name {name!r} is not registered; known: {sorted(_REGISTRY)}")
  return _REGISTRY[name](**kwargs)


def registered() -> list[str]:
  return sorted(_REGISTRY)
