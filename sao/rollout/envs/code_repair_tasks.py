"""Task templates for code_repair: tiny correct programs, one-line planted bugs, and test inputs.

Each template is instantiated for every constant `c` in 2..9 and every bug, giving a few hundred distinct tasks.
`{c}` in a template stands for the constant, `{d}` for c + 1 and `{cc}` for c * c. A bug replaces exactly one line,
so one `edit(line, text)` repairs it. Expected test values are computed by running the correct program here, in
the trainer/worker process: templates are our own trusted code (the model's edits only ever run in the sandbox).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

CONSTANTS = range(2, 10)


@dataclasses.dataclass(frozen=True)
class Template:
  """A correct program, its one-line bugs `(kind, 0-based line, buggy line)`, and the test call expressions."""
  name: str
  lines: tuple[str, ...]
  bugs: tuple[tuple[str, int, str], ...]
  calls: tuple[str, ...]


TEMPLATES = (
    Template("scaled_sum",
             ("def f(n):", "  s = 0", "  for i in range(1, n + 1):", "    s += i * {c}", "  return s"),
             (("off_by_one", 2, "  for i in range(1, n):"), ("wrong_operator", 3, "    s -= i * {c}"),
              ("wrong_constant", 1, "  s = 1"), ("wrong_constant", 3, "    s += i * {d}")),
             ("f(0)", "f(1)", "f(4)", "f(7)")),
    Template("count_above",
             ("def f(xs):", "  k = 0", "  for x in xs:", "    if x > {c}:", "      k += 1", "  return k"),
             (("off_by_one", 3, "    if x >= {c}:"), ("wrong_operator", 3, "    if x < {c}:"),
              ("wrong_constant", 4, "      k += 2"), ("wrong_constant", 1, "  k = 1")),
             ("f([])", "f([{c}])", "f([1, {d}, 20])", "f([{c}, {d}, 0, 50])")),
    Template("clamp",
             ("def f(x):", "  if x < 0:", "    return 0", "  if x > {c}:", "    return {c}", "  return x"),
             (("wrong_operator", 1, "  if x > 0:"), ("wrong_constant", 4, "    return {d}"),
              ("missing_edge_case", 1, "  if x < -10:")),
             ("f(-5)", "f(0)", "f(1)", "f({c})", "f(100)")),
    Template("scaled_mean",
             ("def f(xs):", "  if not xs:", "    return 0", "  return sum(xs) * {c} // len(xs)"),
             (("missing_edge_case", 1, "  if xs is None:"), ("wrong_operator", 3, "  return sum(xs) * {c} % len(xs)"),
              ("off_by_one", 3, "  return sum(xs) * {c} // (len(xs) + 1)")),
             ("f([])", "f([4])", "f([1, 2, 3])", "f([10, 21])")),
    Template("helper_call",
             ("def g(a, b):", "  return a * {c} - b", "def f(x, y):", "  return g(x, y)"),
             (("swapped_arguments", 3, "  return g(y, x)"), ("wrong_operator", 1, "  return a * {c} + b")),
             ("f(1, 2)", "f(5, 3)", "f(0, 7)")),
    Template("int_log",
             ("def f(n):", "  k = 0", "  while n >= {c}:", "    n = n // {c}", "    k += 1", "  return k"),
             (("wrong_constant", 3, "    n = n // 1"), ("off_by_one", 2, "  while n > {c}:"),
              ("wrong_operator", 4, "    k -= 1")),
             ("f(1)", "f({c})", "f({cc})", "f({cc} - 1)", "f(1000)")),
    Template("multiples",
             ("def f(xs):", "  out = []", "  for x in xs:", "    if x % {c} == 0:", "      out.append(x)",
              "  return out"),
             (("wrong_operator", 3, "    if x % {c} != 0:"), ("wrong_constant", 3, "    if x % {d} == 0:"),
              ("off_by_one", 2, "  for x in xs[1:]:")),
             ("f([])", "f(list(range(1, 25)))", "f([0, {c}, {d}])")),
    Template("safe_index",
             ("def f(xs, k):", "  if k >= len(xs):", "    return -1", "  return xs[k] * {c}"),
             (("off_by_one", 1, "  if k > len(xs):"), ("off_by_one", 3, "  return xs[k - 1] * {c}"),
              ("wrong_constant", 2, "    return 0")),
             ("f([1, 2, 3], 0)", "f([1, 2, 3], 2)", "f([1, 2, 3], 3)", "f([], 0)")),
    Template("fib",
             ("def f(n):", "  a, b = 0, 1", "  for _ in range(n):", "    a, b = b, a + b", "  return a * {c}"),
             (("wrong_constant", 1, "  a, b = 1, 1"), ("off_by_one", 2, "  for _ in range(n - 1):"),
              ("wrong_operator", 3, "    a, b = b, a - b")),
             ("f(0)", "f(1)", "f(2)", "f(7)")),
    Template("gcd",
             ("def f(a, b):", "  while b:", "    a, b = b, a % b", "  return a * {c}"),
             (("swapped_arguments", 2, "    a, b = a % b, b"), ("wrong_operator", 2, "    a, b = b, a // b")),
             ("f(12, 8)", "f(7, 3)", "f(5, 0)", "f(9, 6)")),
    Template("power",
             ("def p(base, e):", "  return base ** e", "def f(x):", "  return p(x, {c}) - x"),
             (("swapped_arguments", 3, "  return p({c}, x) - x"), ("wrong_operator", 1, "  return base * e"),
              ("wrong_constant", 3, "  return p(x, {d}) - x")),
             ("f(1)", "f(2)", "f(3)")),
    Template("max_plus",
             ("def f(xs):", "  best = xs[0]", "  for x in xs:", "    if x > best:", "      best = x",
              "  return best + {c}"),
             (("wrong_operator", 3, "    if x < best:"), ("wrong_constant", 1, "  best = 0"),
              ("off_by_one", 2, "  for x in xs[:-1]:")),
             ("f([3])", "f([1, 5, 2])", "f([-4, -2, -9])", "f([1, 2, 8])")),
    Template("count_char",
             ("def f(s):", "  n = 0", "  for ch in s:", '    if ch == "a":', "      n += {c}", "  return n"),
             (("wrong_operator", 3, '    if ch != "a":'), ("wrong_constant", 4, "      n += {d}"),
              ("off_by_one", 2, "  for ch in s[1:]:")),
             ('f("")', 'f("banana")', 'f("abc")', 'f("xyz")')),
    Template("abs_diff",
             ("def f(a, b):", "  if a > b:", "    return (a - b) * {c}", "  return (b - a) * {c}"),
             (("swapped_operands", 2, "    return (b - a) * {c}"), ("wrong_operator", 1, "  if a < b:")),
             ("f(5, 2)", "f(2, 5)", "f(3, 3)", "f(0, 9)")),
)


def _fill(text: str, c: int) -> str:
  return text.format(c=c, d=c + 1, cc=c * c)


def _source(lines: list[str]) -> str:
  return "\n".join(lines) + "\n"


def expected_values(solution: str, calls: list[str]) -> list[Any]:
  """Runs the (trusted, template-made) correct program in-process and evaluates each call."""
  namespace: dict[str, Any] = {}
  exec(compile(solution, "solution.py", "exec"), namespace)  # noqa: S102 -- our own template code, never model's
  return [eval(call, namespace) for call in calls]  # noqa: S307


@functools.lru_cache(maxsize=None)
def _pool() -> tuple[dict[str, Any], ...]:
  tasks = []
  for template in TEMPLATES:
    for c in CONSTANTS:
      solution_lines = [_fill(line, c) for line in template.lines]
      solution = _source(solution_lines)
      calls = [_fill(call, c) for call in template.calls]
      expected = expected_values(solution, calls)
      for bug_index, (kind, line, buggy) in enumerate(template.bugs):
        program_lines = list(solution_lines)
        program_lines[line] = _fill(buggy, c)
        tasks.append({
            "key": f"code_repair/{template.name}/c{c}/b{bug_index}",
            "template": template.name,
            "bug": kind,
            "bug_line": line + 1,
            "program": _source(program_lines),
            "solution": solution,
            "tests": [[call, value] for call, value in zip(calls, expected)],
        })
  return tuple(tasks)


def task_pool() -> list[dict[str, Any]]:
  """Every (template, constant, bug) task, in a fixed order; fresh dicts (callers may mutate them)."""
  return [dict(t, tests=[list(x) for x in t["tests"]]) for t in _pool()]
