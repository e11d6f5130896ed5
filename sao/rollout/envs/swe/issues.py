"""Issue reports for generated bugs: what a user would file after hitting one failing case.

Written from the failing test case itself (the call, the value the correct code gives, what the buggy code does), so
the report is always true; wording, title and structure vary with the repository's seeded `random.Random`.
"""
from __future__ import annotations

import random
import re
import shlex
from typing import Any

from sao.rollout.envs.swe.library import Case

_CLOSINGS = ("", "Thanks!", "Happy to open a PR if someone confirms this is a bug.",
             "This breaks one of our scripts, so a fix would be much appreciated.",
             "Let me know if you need more details.",
             "I think this started after the last refactoring, but I have not bisected it.")
_ENVIRONMENTS = ("Python 3.11 on Ubuntu 22.04", "Python 3.12, macOS 14", "Python 3.10 on Debian",
                 "Python 3.11, Windows 11")


def _shown(kind: str, value: Any) -> str:
  return repr(value) if kind == "value" else f"{type(value).__name__}: {value}"


def _symbol(case: Case) -> str:
  """The name the user calls: the class for method cases (set up first), else the first called function."""
  for text in case.setup + (case.expr,):
    match = re.search(r"\b([A-Za-z_]\w*)\(", text)
    if match and match.group(1) not in ("range", "list", "sorted", "len", "print"):
      return match.group(1)
  return case.expr


def problem_statement(rng: random.Random, project: str, package: str, module: str, version: str, case: Case,
                      expected: Any, actual: tuple[str, Any]) -> tuple[str, str]:
  """(issue text, a bash command that reproduces the bug) for `case` failing with `actual`."""
  symbol = _symbol(case)
  code_lines = [f"from {package}.{module} import {symbol if symbol != case.expr else '*'}", *case.setup,
                f"print({case.expr})"]
  code = "\n".join(code_lines)
  kind, value = actual
  got = _shown(kind, value)
  if case.raises:
    want = f"a {case.raises}"
    titles = ([f"`{symbol}` does not reject invalid input", f"{case.expr} should raise {case.raises}"]
              if kind == "value" else
              [f"`{symbol}` raises {type(value).__name__} instead of {case.raises}",
               f"Wrong exception type from {package}.{module}.{symbol}"])
  else:
    want = f"`{expected!r}`"
    titles = ([f"`{symbol}` crashes with {type(value).__name__}",
               f"{type(value).__name__} in {package}.{module}.{symbol}"]
              if kind == "raises" else
              [f"`{symbol}` returns {value!r} instead of {expected!r}",
               f"Wrong result from {package}.{module}.{symbol}",
               f"{symbol}() gives an incorrect value"])
  title = rng.choice(titles)
  intro = rng.choice((
      f"I'm using {project} {version} and ran into a problem with `{package}.{module}.{symbol}`.",
      f"Found a bug in `{symbol}` (module `{package}.{module}`).",
      f"After upgrading to {project} {version}, `{symbol}` no longer behaves as documented.",
  ))
  if kind == "value":
    observed = rng.choice((f"This prints `{got}`, but I expected {want}.",
                           f"Expected: {want}\nActual: `{got}`"))
  else:
    observed = rng.choice((f"This fails with\n\n```\n{got}\n```\n\nbut I expected {want}.",
                           f"Expected: {want}\nActual: it raises `{got}`"))
  body = [f"### {title}", "", intro, "", "To reproduce:", "", "```python", code, "```", "", observed, "",
          f"Environment: {rng.choice(_ENVIRONMENTS)}."]
  closing = rng.choice(_CLOSINGS)
  if closing:
    body += ["", closing]
  repro = f"python -c {shlex.quote(code)}"
  return "\n".join(body) + "\n", repro
