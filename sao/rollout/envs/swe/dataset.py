"""SWE-bench instances: the JSONL format, validation, and where each instance's repository snapshot comes from.

A line of the JSONL is one SWE-bench instance (princeton-nlp/SWE-bench, SWE-bench Verified / Multilingual,
nebius/SWE-bench-extra, SWE-Gym ... share these fields):

  required  instance_id, repo, base_commit, problem_statement, test_patch, FAIL_TO_PASS, PASS_TO_PASS
  optional  patch (the gold fix), hints_text, created_at, version, environment_setup_commit, difficulty, meta

`FAIL_TO_PASS` / `PASS_TO_PASS` are lists of test ids, either as JSON lists or (as on the Hugging Face hub) as
strings holding a JSON list. Any other field, a missing field or a wrongly typed one is a `DatasetError` naming the
instance and the field.

Repositories come from local snapshots only (no network at run time): for `repo` "owner/name" the loader looks in
`snapshot_root` for, in this order, a git directory `owner__name/` (or `owner/name/`), a git bundle
`owner__name.bundle`, or a tarball `owner__name.tar`, `.tar.gz`, `.tgz` (holding a git repository, at its top level
or in one top-level directory). This module is the format and its validation; `snapshots.git_source` turns a
`Snapshot` into something `git clone` reads (unpacking tarballs, generating repositories).

    instances = load_jsonl("swe.jsonl", snapshot_root="repos/")
    task = instances[0].to_task()         # a plain dict, as environment tasks travel to workers
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
from typing import Any, Iterable, Mapping

REQUIRED_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "test_patch", "FAIL_TO_PASS",
                   "PASS_TO_PASS")
OPTIONAL_FIELDS = ("patch", "hints_text", "created_at", "version", "environment_setup_commit", "difficulty", "meta")
SNAPSHOT_KINDS = ("dir", "bundle", "tarball", "generated")
_TARBALL_SUFFIXES = (".tar", ".tar.gz", ".tgz")


class DatasetError(ValueError):
  """A malformed instance or an unusable snapshot; the message names the instance (or the line)."""


@dataclasses.dataclass(frozen=True)
class Snapshot:
  """Where a repository comes from: kind "dir" / "bundle" / "tarball" with a path, or "generated" with a name."""
  kind: str
  path: str

  def __post_init__(self):
    if self.kind not in SNAPSHOT_KINDS:
      raise DatasetError(f"snapshot kind {self.kind!r} is not one of {SNAPSHOT_KINDS}")

  def to_json(self) -> dict[str, str]:
    return {"kind": self.kind, "path": self.path}

  @classmethod
  def from_json(cls, obj: Mapping[str, Any]) -> Snapshot:
    return cls(kind=str(obj["kind"]), path=str(obj["path"]))


@dataclasses.dataclass(frozen=True)
class Instance:
  """One SWE-bench instance and its repository snapshot."""
  instance_id: str
  repo: str
  base_commit: str
  problem_statement: str
  test_patch: str
  fail_to_pass: tuple[str, ...]
  pass_to_pass: tuple[str, ...]
  snapshot: Snapshot
  patch: str = ""
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the other optional SWE-bench fields

  def to_json(self) -> dict[str, Any]:
    """The instance in SWE-bench's JSONL form (test ids as JSON lists)."""
    out = {"instance_id": self.instance_id, "repo": self.repo, "base_commit": self.base_commit,
           "problem_statement": self.problem_statement, "test_patch": self.test_patch,
           "FAIL_TO_PASS": list(self.fail_to_pass), "PASS_TO_PASS": list(self.pass_to_pass)}
    if self.patch:
      out["patch"] = self.patch
    out.update(self.extra)
    return out

  def to_task(self, **settings: Any) -> dict[str, Any]:
    """A JSON-serialisable environment task (`env`, `key`, the instance, the snapshot, and `settings`)."""
    return {"env": "swe", "key": self.instance_id, "task_id": self.instance_id, "instance": self.to_json(),
            "snapshot": self.snapshot.to_json(), **settings}

  @classmethod
  def from_task(cls, task: Mapping[str, Any]) -> Instance:
    if "instance" not in task or "snapshot" not in task:
      raise DatasetError(f"task {task.get('task_id')!r}: needs 'instance' and 'snapshot' (see Instance.to_task)")
    return parse_instance(task["instance"], Snapshot.from_json(task["snapshot"]))


def _test_ids(value: Any, field: str, where: str) -> tuple[str, ...]:
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError as e:
      raise DatasetError(f"{where}: {field} is a string but not a JSON list ({e.msg} at char {e.pos})") from None
  if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
    raise DatasetError(f"{where}: {field} must be a list of non-empty test-id strings, got {type(value).__name__}")
  return tuple(value)


def parse_instance(obj: Any, snapshot: Snapshot, where: str = "") -> Instance:
  """Validates one SWE-bench record; `where` prefixes errors (e.g. "swe.jsonl:3")."""
  if not isinstance(obj, dict):
    raise DatasetError(f"{where or 'instance'}: expected a JSON object, got {type(obj).__name__}")
  name = obj.get("instance_id")
  where = f"{where + ' ' if where else ''}instance {name!r}" if isinstance(name, str) else (where or "instance")
  missing = [f for f in REQUIRED_FIELDS if f not in obj]
  if missing:
    raise DatasetError(f"{where}: missing required field(s) {missing}")
  unknown = sorted(set(obj) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
  if unknown:
    raise DatasetError(f"{where}: unknown field(s) {unknown}; known: {list(REQUIRED_FIELDS + OPTIONAL_FIELDS)}")
  for field in ("instance_id", "repo", "base_commit", "problem_statement", "test_patch", "patch"):
    if field in obj and not isinstance(obj[field], str):
      raise DatasetError(f"{where}: {field} must be a string, got {type(obj[field]).__name__}")
  for field in ("instance_id", "repo", "base_commit", "problem_statement"):
    if not obj[field].strip():
      raise DatasetError(f"{where}: {field} is empty")
  fail_to_pass = _test_ids(obj["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
  if not fail_to_pass:
    raise DatasetError(f"{where}: FAIL_TO_PASS is empty (nothing would show that the issue is resolved)")
  pass_to_pass = _test_ids(obj["PASS_TO_PASS"], "PASS_TO_PASS", where)
  extra = {k: obj[k] for k in OPTIONAL_FIELDS if k in obj and k != "patch"}
  return Instance(instance_id=obj["instance_id"], repo=obj["repo"], base_commit=obj["base_commit"],
                  problem_statement=obj["problem_statement"], test_patch=obj["test_patch"],
                  fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass, snapshot=snapshot,
                  patch=obj.get("patch", ""), extra=extra)


def find_snapshot(repo: str, snapshot_root: pathlib.Path | str) -> Snapshot:
  """The local snapshot of `repo` ("owner/name") under `snapshot_root`; raises `DatasetError` listing the tries."""
  root = pathlib.Path(snapshot_root)
  flat = repo.replace("/", "__")
  tried = []
  for d in (root / flat, root / repo):
    tried.append(str(d) + "/")
    if d.is_dir():
      if not (d / ".git").exists() and not (d / "HEAD").is_file():
        raise DatasetError(f"snapshot {d} of {repo!r} is a directory but not a git repository")
      return Snapshot("dir", str(d.resolve()))
  bundle = root / f"{flat}.bundle"
  tried.append(str(bundle))
  if bundle.is_file():
    return Snapshot("bundle", str(bundle.resolve()))
  for suffix in _TARBALL_SUFFIXES:
    tarball = root / f"{flat}{suffix}"
    tried.append(str(tarball))
    if tarball.is_file():
      return Snapshot("tarball", str(tarball.resolve()))
  raise DatasetError(f"no snapshot of repo {repo!r}; tried {tried}")


def load_jsonl(path: pathlib.Path | str, snapshot_root: pathlib.Path | str, check_commits: bool = True
               ) -> list[Instance]:
  """Reads a SWE-bench JSONL; every error names the line and instance.

  Args:
    path: the JSONL file (one instance per non-empty line).
    snapshot_root: the directory holding the repositories' snapshots (see the module docstring).
    check_commits: for directory snapshots, check that `base_commit` exists (one cheap `git cat-file` each).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise DatasetError(f"{path}: no such file")
  instances, seen = [], {}
  with path.open(encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path.name}:{lineno}"
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: invalid JSON ({e.msg} at char {e.pos})") from None
      repo = obj.get("repo") if isinstance(obj, dict) else None
      if not isinstance(repo, str):
        parse_instance(obj, Snapshot("dir", ""), where)  # raises the precise error
      try:
        snapshot = find_snapshot(repo, snapshot_root)
      except DatasetError as e:
        raise DatasetError(f"{where} instance {obj.get('instance_id')!r}: {e}") from None
      instance = parse_instance(obj, snapshot, where)
      if instance.instance_id in seen:
        raise DatasetError(f"{where}: instance_id {instance.instance_id!r} repeats line {seen[instance.instance_id]}")
      seen[instance.instance_id] = lineno
      if check_commits and snapshot.kind == "dir":
        proc = subprocess.run(["git", "-C", snapshot.path, "cat-file", "-e", f"{instance.base_commit}^{{commit}}"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
          raise DatasetError(f"{where} instance {instance.instance_id!r}: base_commit {instance.base_commit} is not "
                             f"a commit of {snapshot.path}")
      instances.append(instance)
  return instances


def write_jsonl(path: pathlib.Path | str, instances: Iterable[Instance]) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for instance in instances:
      f.write(json.dumps(instance.to_json()) + "\n")
