"""SWE-bench JSONL loading (directory, bundle and tarball snapshots), its errors, and the generated dataset."""
from __future__ import annotations

import collections
import json
import subprocess
import tarfile

import pytest

from sao.rollout.envs import split_of
from sao.rollout.envs.swe import dataset, generator, snapshots
from sao.rollout.envs.swe.dataset import DatasetError
from sao.rollout.envs.swe.library import BUG_KINDS
from sao.rollout.envs.swe.sandbox import Sandbox


def write(tmp_path, *records):
  path = tmp_path / "x.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return path


def test_loads_swe_bench_record_from_directory(calc_dataset):
  jsonl, root, record = calc_dataset
  [instance] = dataset.load_jsonl(jsonl, root)
  assert instance.instance_id == "acme__calc-1" and instance.repo == "acme/calc"
  assert instance.fail_to_pass == ("tests/test_ops.py::test_clamp_high",)  # decoded from the hub's JSON string
  assert len(instance.pass_to_pass) == 3 and instance.patch == record["patch"]
  assert instance.snapshot.kind == "dir" and instance.extra["version"] == "0.1"
  assert dataset.Instance.from_task(instance.to_task()) == instance


def test_loads_bundle_and_tarball_snapshots(calc_dataset, tmp_path):
  _, root, record = calc_dataset
  bundle_root, tar_root = tmp_path / "bundles", tmp_path / "tars"
  bundle_root.mkdir()
  tar_root.mkdir()
  subprocess.run(["git", "-C", str(root / "acme__calc"), "bundle", "create", str(bundle_root / "acme__calc.bundle"),
                  "--all"], check=True, capture_output=True)
  with tarfile.open(tar_root / "acme__calc.tar.gz", "w:gz") as tf:
    tf.add(root / "acme__calc", arcname="calc-main")
  for snapshot_root, kind in ((bundle_root, "bundle"), (tar_root, "tarball")):
    [instance] = dataset.load_jsonl(write(tmp_path, record), snapshot_root)
    assert instance.snapshot.kind == kind
    with Sandbox.create(snapshots.git_source(instance.snapshot), instance.base_commit) as box:
      assert box.run("git rev-parse HEAD").output.strip() == record["base_commit"]


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("test_patch"), "missing required field(s) ['test_patch']"),
    (lambda r: r.update(flavour="x"), "unknown field(s) ['flavour']"),
    (lambda r: r.update(FAIL_TO_PASS="not json"), "FAIL_TO_PASS is a string but not a JSON list"),
    (lambda r: r.update(FAIL_TO_PASS=[]), "FAIL_TO_PASS is empty"),
    (lambda r: r.update(PASS_TO_PASS=[1, 2]), "PASS_TO_PASS must be a list of non-empty test-id strings"),
    (lambda r: r.update(base_commit=7), "base_commit must be a string"),
    (lambda r: r.update(base_commit="0" * 40), "is not a commit of"),
    (lambda r: r.update(repo="acme/other"), "no snapshot of repo 'acme/other'"),
])
def test_bad_records_name_the_instance_and_problem(calc_dataset, tmp_path, change, message):
  _, root, record = calc_dataset
  record = dict(record)
  change(record)
  with pytest.raises(DatasetError) as info:
    dataset.load_jsonl(write(tmp_path, record), root)
  assert message in str(info.value) and "x.jsonl:1" in str(info.value)
  if "instance_id" in record:
    assert "acme__calc-1" in str(info.value)


def test_bad_lines_and_duplicates(calc_dataset, tmp_path):
  _, root, record = calc_dataset
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(record) + "\n{oops\n")
  with pytest.raises(DatasetError, match=r"bad.jsonl:2: invalid JSON"):
    dataset.load_jsonl(path, root)
  with pytest.raises(DatasetError, match=r"instance_id 'acme__calc-1' repeats line 1"):
    dataset.load_jsonl(write(tmp_path, record, record), root)
  with pytest.raises(DatasetError, match="no such file"):
    dataset.load_jsonl(tmp_path / "missing.jsonl", root)


def test_generated_dataset_size_kinds_and_splits():
  tasks = generator.tasks(240)
  repos = [t["instance"]["repo"] for t in tasks]
  assert len(set(repos)) == 240 and generator.MAX_REPOS >= 240
  assert set(collections.Counter(t["bug_kind"] for t in tasks)) == set(BUG_KINDS)
  splits = collections.Counter(split_of(r) for r in repos)
  assert splits["validation"] >= 15 and splits["test"] >= 15
  for split in ("train", "validation", "test"):  # a repository belongs to exactly one split
    assert all(split_of(t["instance"]["repo"]) == split for t in generator.tasks(240, split))
  for t in tasks[:20]:
    instance = dataset.Instance.from_task(t)
    assert instance.fail_to_pass and instance.pass_to_pass
    assert not set(instance.fail_to_pass) & set(instance.pass_to_pass)
    assert instance.problem_statement.startswith("### ") and "```python" in instance.problem_statement


def test_generated_repos_are_deterministic_and_hashes_match_git():
  a, b = generator.spec(3), generator.spec(3)
  assert a.instance == b.instance and a.files == b.files
  path = generator.materialize(generator.snapshot_of(3).path)  # raises if git's commit id differs
  head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
  assert head == a.instance["base_commit"]
  with pytest.raises(DatasetError, match="expected 'v1/<index>'"):
    generator.materialize("v999/3")


def test_exported_generated_dataset_loads_as_swe_bench(tmp_path):
  jsonl = generator.write_dataset(tmp_path, 2)
  instances = dataset.load_jsonl(jsonl, tmp_path)
  assert [i.instance_id for i in instances] == [generator.spec(i).instance["instance_id"] for i in range(2)]
  assert all(i.snapshot.kind == "dir" for i in instances)


def test_swe_modules_import_no_cycle():
  """The SWE modules' imports (function-level ones too) form no cycle: `dataset` is the format only, `snapshots`
  materialises snapshots, on top of `generator`."""
  import ast
  import pathlib

  import sao.rollout.envs.swe as swe_pkg
  root = pathlib.Path(swe_pkg.__file__).parent
  names = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__") or "": p
           for p in root.rglob("*.py")}
  prefix = "sao.rollout.envs.swe"
  graph = {}
  for name, path in names.items():
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix):
        base = node.module[len(prefix):].lstrip(".")
        for alias in node.names:
          full = f"{base}.{alias.name}".lstrip(".")
          deps.add(full if full in names else base)
      elif isinstance(node, ast.Import):
        deps.update(a.name[len(prefix):].lstrip(".") for a in node.names if a.name.startswith(prefix + "."))
    graph[name] = deps - {name}
  assert "generator" not in graph["dataset"] and "snapshots" not in graph["dataset"]

  def visit(name, stack):
    for dep in graph.get(name, ()):
      assert dep not in stack, f"import cycle: {' -> '.join(stack[stack.index(dep):] + [dep])}"
      visit(dep, stack + [dep])

  for name in graph:
    visit(name, [name])
