"""Types of the generated SWE dataset's module library: small correct Python modules, their test cases, planted bugs.

A `ModuleTemplate` is a module's source (a `string.Template`: `${NAME}` placeholders take per-repository values from
`params`, and `${NAME_ALT}` a different value of the same list, for wrong-default bugs), its test cases, and its
bugs. A `Case` is a pytest test: optional setup lines, then an expression that must equal the value the correct
module computes, or raise `raises`. A `Bug` replaces one snippet (exactly one occurrence in the module) with a
buggy one; which tests it breaks is computed by running the cases, never written by hand.
"""
from __future__ import annotations

import dataclasses

BUG_KINDS = ("off_by_one", "wrong_operator", "wrong_default", "swapped_arguments", "missing_edge_case",
             "wrong_exception")


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  expr: str
  setup: tuple[str, ...] = ()
  raises: str | None = None


@dataclasses.dataclass(frozen=True)
class Bug:
  kind: str
  symbol: str  # the function or method holding the bug (the expert greps for it)
  correct: str
  buggy: str

  def __post_init__(self):
    if self.kind not in BUG_KINDS:
      raise ValueError(f"bug kind {self.kind!r} is not one of {BUG_KINDS}")


@dataclasses.dataclass(frozen=True)
class ModuleTemplate:
  name: str
  doc: str
  source: str
  cases: tuple[Case, ...]
  bugs: tuple[Bug, ...]
  params: dict = dataclasses.field(default_factory=dict)


def C(name, expr, *setup, raises=None):  # noqa: N802 — a terse constructor keeps the tables readable
  return Case(name, expr, tuple(setup), raises)
