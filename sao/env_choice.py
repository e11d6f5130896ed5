"""A process setting chosen by an environment variable among a few named values (`SAO_NATIVE_KERNELS`,
`SAO_HOST_MALLOC`): read the same way everywhere, and a value outside them an error that names the variable and
every choice.

It imports nothing from `sao`: the native kernels' build (`sao.kernels.build`) and the engines' host settings
(`sao.engines.host_malloc`) sit on different floors and both read one.
"""
from __future__ import annotations

import os
from typing import Mapping


def read(variable: str, meanings: Mapping[str, str], default: str, env: Mapping[str, str] | None = None) -> str:
  """The value of `variable` in `env` (default `os.environ`), stripped and lowercased; `default` when unset or empty.

  `meanings` maps each allowed value to what it does, for the error; ValueError naming the variable, the value
  given and each choice (the default marked) when the value is not one of them."""
  if default not in meanings:
    raise ValueError(f"{variable}: the default {default!r} is not one of {sorted(meanings)}")
  value = (os.environ if env is None else env).get(variable, default).strip().lower() or default
  if value not in meanings:
    described = [f"{choice!r} ({meaning}{'; the default' if choice == default else ''})"
                 for choice, meaning in meanings.items()]
    listed = described[0] if len(described) == 1 else ", ".join(described[:-1]) + " or " + described[-1]
    raise ValueError(f"{variable}={value!r}: expected {listed}")
  return value
