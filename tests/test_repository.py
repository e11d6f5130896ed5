"""The repository stands on its own: no tracked file names a path outside it (the docs it needs are in docs/)."""
import os
import re
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Paths that exist only on the machine the project was developed on, never in a clone. Spelled in pieces so that
# this file itself names none of them (it is scanned like every other file).
SHARED, REFERENCE, WORKDIR, SEED = "../" + "shared", "REFERENCE" + ".md", "/" + "work/", "seed" + "/000"
OUTSIDE_PATHS = (SHARED, REFERENCE, WORKDIR, SEED)


def tracked_files() -> list[pathlib.Path]:
  """`git ls-files` of the repository; every file under it (but .git) when it is not a git checkout."""
  try:
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return [pathlib.Path(d, f) for d, dirs, files in os.walk(ROOT) if ".git" not in pathlib.Path(d).parts
            for f in files]
  return [ROOT / name for name in listing.decode().split("\0") if name]


def outside_references(paths: list[pathlib.Path], root: pathlib.Path = ROOT) -> list[str]:
  """`path:line: pattern` (path relative to `root`) for every line of `paths` that names one of `OUTSIDE_PATHS`."""
  found = []
  for path in paths:
    if not path.is_file():
      continue
    text = path.read_bytes().decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
      found += [f"{path.relative_to(root)}:{number}: {p}" for p in OUTSIDE_PATHS if p in line]
  return found


def test_lists_the_repository():
  names = {p.relative_to(ROOT).as_posix() for p in tracked_files()}
  assert {"README.md", "docs/algorithm.md", "sao/core/advantages.py"} <= names


def test_no_file_names_a_path_outside_the_repository():
  found = outside_references(tracked_files())
  assert not found, "files name paths outside the repository (point them at docs/ instead):\n" + "\n".join(found)


@pytest.mark.parametrize("line, pattern", [(f"see {SHARED}/DESIGN.md", SHARED), (f"formulas in {REFERENCE}", REFERENCE),
                                           (f"cd {WORKDIR}main", WORKDIR), (f"the write-up {SEED}_x.txt", SEED)])
def test_detects_each_outside_path(tmp_path, line, pattern):
  probe = tmp_path / "notes.md"
  probe.write_text(f"a clean line\n{line}\n")
  assert outside_references([probe], root=tmp_path) == [f"notes.md:2: {pattern}"]


def test_test_modules_in_non_package_directories_have_unique_basenames():
  """pytest imports a test file of a directory without `__init__.py` by its basename: two such files with one
  name stop the whole suite at collection ("import file mismatch")."""
  tests_root = os.path.dirname(os.path.abspath(__file__))
  seen: dict[str, str] = {}
  clashes = []
  for directory, _, files in os.walk(tests_root):
    if "__init__.py" in files or "__pycache__" in directory:
      continue
    for f in files:
      if f.startswith("test_") and f.endswith(".py"):
        path = os.path.relpath(os.path.join(directory, f), tests_root)
        if f in seen:
          clashes.append(f"{seen[f]} and {path}")
        seen.setdefault(f, path)
  assert clashes == []


# A citation of a numbered working period (the word, then a number): a reader cannot resolve it; the docs and the
# code name a date, a commit or a docs section instead. Spelled in pieces so this file does not match itself.
WORKING_PERIOD = re.compile(r"\b" + "sess" + r"ions? \d+")


def working_period_citations(paths: list[pathlib.Path], root: pathlib.Path = ROOT) -> list[str]:
  found = []
  for path in paths:
    if not path.is_file() or path.suffix not in (".py", ".md", ".txt", ".sh", ".cfg", ".toml", ".ini", ""):
      continue
    try:
      lines = path.read_text(errors="strict").splitlines()
    except (UnicodeDecodeError, OSError):
      continue
    found += [f"{path.relative_to(root)}:{n}" for n, line in enumerate(lines, 1) if WORKING_PERIOD.search(line)]
  return found


def test_no_file_cites_a_numbered_working_period():
  assert not working_period_citations(tracked_files()), working_period_citations(tracked_files())[:20]


def test_detects_a_working_period_citation(tmp_path):
  (tmp_path / "a.md").write_text("as measured in " + "sess" + "ion 12 on the toy\n")
  (tmp_path / "b.py").write_text("# the proxy's session idle timeout\n")
  assert working_period_citations([tmp_path / "a.md", tmp_path / "b.py"], tmp_path) == ["a.md:1"]
