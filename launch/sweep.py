"""Sweeps: lists of runs built from products and zips of config overrides, big_vision `sweep_hyper` style.

A sweep file (`launch/sweeps/<name>.py`) defines `get_sweep() -> list[Run]`:

    from launch import sweep as s

    def get_sweep():
      seeds = s.zip_(s.sweep("seed", [0, 1, 2]), s.sweep("learner.seed", [0, 1, 2]))
      return s.runs("sao", "experiments/configs/sao_openswe.py:toy", seeds, name_keys=("seed",))

A grid is a list of dicts `{dotted config key: value}`; `product` takes every combination of its argument grids,
`zip_` pairs them point by point, `fixed` is a one-point grid. A `Run` becomes the command
`python experiments/train.py --config=<file>:<arg> --config.<key>=<value>... --workdir=<root>/<name>`.
`validate_run` loads the run's config and rejects keys it does not have, before anything is launched.

Arms and budgets. `runs(prefix, ...)` names each run's arm `prefix` (`sao-seed3` is a seed of arm `sao`): the
analysis (`experiments/reproduce.py --sweep=<name>`) pools an arm's seeds. `rl_trajectory_budget` is a run's RL
rollout budget in trajectories (`total_steps × rollout.batch_size`: the trainer consumes exactly `batch_size`
finished trajectories per step, trained or dropped; value pretraining is not counted, as in the write-up);
`check_equal_budgets` refuses a comparison whose arms differ in it.

Code versions. `code_version()` is the checkout's commit (with `+dirty.<hash of git diff HEAD>` when tracked files
differ from it); `launch.local` writes it into every run directory (`code_version.json`) before the run starts and
refuses to start or resume any run of a sweep whose directories hold another version: runs of different code never
share one sweep's tables (continue a sweep at a new commit in a new workdir; `reproduce.py` refuses mixed versions).

A sweep file may also define `ANALYSIS = {"kind": ..., ...}`: which tables `reproduce.py --sweep=<name>` prints
for it (`load_analysis`); with `"reference": <arm>` it also draws each other arm against that one
(`<sweep>_factors.png`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from typing import Any, Mapping, Sequence

from sao import run_config

Grid = list[dict[str, Any]]
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def sweep(key: str, values: Sequence[Any]) -> Grid:
  """One key over several values: `sweep("seed", [0, 1])` -> `[{"seed": 0}, {"seed": 1}]`."""
  if not values:
    raise ValueError(f"sweep({key!r}): no values")
  return [{key: v} for v in values]


def fixed(**overrides: Any) -> Grid:
  """A one-point grid (settings shared by every run): `fixed(total_steps=50)`. Dotted keys via `**{"a.b": 1}`."""
  return [dict(overrides)]


def _merge(points: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  merged: dict[str, Any] = {}
  for point in points:
    for key, value in point.items():
      if key in merged and merged[key] != value:
        raise ValueError(f"sweep: key {key!r} is set twice with different values ({merged[key]!r}, {value!r})")
      merged[key] = value
  return merged


def product(*grids: Grid) -> Grid:
  """Every combination: `product(sweep("a", [1, 2]), sweep("b", [3, 4]))` has 4 points (the last varies fastest)."""
  return [_merge(points) for points in itertools.product(*grids)]


def zip_(*grids: Grid) -> Grid:
  """Point by point; the grids must have equal lengths."""
  lengths = {len(g) for g in grids}
  if len(lengths) > 1:
    raise ValueError(f"zip_: grids of different lengths {[len(g) for g in grids]}")
  return [_merge(points) for points in zip(*grids)]


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run: a config (`<file>:<arg>`, file relative to the repo root) plus dotted overrides."""
  name: str
  config: str
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  arm: str = ""  # the arm whose seeds the analysis pools ("" = the run is its own arm)

  @property
  def arm_name(self) -> str:
    return self.arm or self.name

  def __post_init__(self):
    if not _NAME_RE.match(self.name):
      raise ValueError(f"run name {self.name!r}: use letters, digits and _.+- (it becomes a directory name)")
    if ":" not in self.config:
      raise ValueError(f"run {self.name}: config {self.config!r} must be '<file>:<arg>'")

  @property
  def config_file(self) -> str:
    return self.config.split(":", 1)[0]

  @property
  def config_arg(self) -> str:
    return self.config.split(":", 1)[1]

  def command(self, workdir: str, train_script: str = "experiments/train.py",
              python: str = sys.executable) -> list[str]:
    """The argv that trains this run in `workdir` (run from the repo root)."""
    flags = run_config.override_flags(self.overrides)
    return [python, train_script, f"--config={self.config}", *flags, f"--workdir={workdir}"]

  def evaluate_command(self, workdir: str, python: str = sys.executable) -> list[str]:
    """The argv that re-measures this run's final policy (`experiments/evaluate.py`; results land in
    `<workdir>/evaluation/vN.json`)."""
    return self.command(workdir, "experiments/evaluate.py", python)


format_value = run_config.format_value  # a config flag value ml_collections parses back to the same value


def _short(key: str) -> str:
  return key.rsplit(".", 1)[-1]


def runs(prefix: str, config: str, grid: Grid | None = None, name_keys: Sequence[str] | None = None) -> list[Run]:
  """One run per grid point, named `<prefix>-<key><value>...` (`sao-seed0`) over `name_keys` (default: the keys
  that vary across the grid)."""
  grid = grid or [{}]
  if name_keys is None:
    name_keys = [k for k in sorted({k for p in grid for k in p}) if len({repr(p.get(k)) for p in grid}) > 1]
  out = []
  for point in grid:
    missing = [k for k in name_keys if k not in point]
    if missing:
      raise ValueError(f"runs({prefix!r}): name key(s) {missing} not in grid point {point}")
    suffix = "".join(f"-{_short(k)}{format_value(point[k])}" for k in name_keys)
    out.append(Run(prefix + suffix, config, dict(point), arm=prefix))
  return out


def ablation_runs(reference: str, config: str, seeds: Sequence[int], factors: dict[str, tuple[str, dict[str, Any]]],
                  by_seed: bool = False) -> list[Run]:
  """A one-factor ablation: the `reference` arm and one arm per `factors` entry (arm → (what changes, overrides)),
  each at every seed, named `<arm>-seed<k>`. `by_seed`: ordered seed by seed (every arm of seed 0 first), so runs cut
  short by the clock still leave complete seeds."""
  grid = sweep("seed", seeds)
  run_list = runs(reference, config, grid, name_keys=("seed",))
  for arm, (_, overrides) in factors.items():
    run_list += runs(arm, config, product(grid, fixed(**overrides)), name_keys=("seed",))
  return sorted(run_list, key=lambda run: run.overrides["seed"]) if by_seed else run_list


def check_unique(run_list: Sequence[Run]) -> None:
  names = [r.name for r in run_list]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"sweep: duplicate run names {duplicates} (they would share a workdir)")


def _import_sweep(path: str):
  if not os.path.isfile(path):
    raise FileNotFoundError(f"sweep file {path!r} does not exist")
  spec = importlib.util.spec_from_file_location(f"_sweep_{os.path.basename(path)[:-3]}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def sweep_path(name: str, repo_root: str = REPO_ROOT) -> str:
  """`"toy_algorithms"` -> `<repo>/launch/sweeps/toy_algorithms.py` (a path ending in .py is returned as is)."""
  return name if name.endswith(".py") else os.path.join(repo_root, "launch", "sweeps", f"{name}.py")


def load_analysis(path: str) -> dict[str, Any]:
  """The sweep file's `ANALYSIS` dict (which tables describe it); ValueError when it has none."""
  module = _import_sweep(path)
  analysis = getattr(module, "ANALYSIS", None)
  if not isinstance(analysis, dict) or "kind" not in analysis:
    raise ValueError(f"sweep file {path!r} defines no ANALYSIS dict with a 'kind'")
  return dict(analysis)


def load_sweep(path: str) -> list[Run]:
  """Imports a sweep file and returns its `get_sweep()` runs, checked for types and unique names."""
  module = _import_sweep(path)
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"sweep file {path!r} defines no get_sweep()")
  run_list = list(module.get_sweep())
  if not run_list:
    raise ValueError(f"sweep file {path!r}: get_sweep() returned no runs")
  for run in run_list:
    if not isinstance(run, Run):
      raise TypeError(f"sweep file {path!r}: get_sweep() must return Run objects, got {type(run).__name__}")
  check_unique(run_list)
  return run_list


def load_config(config: str, repo_root: str = REPO_ROOT):
  """`"experiments/configs/x.py:toy"` -> the ConfigDict its `get_config("toy")` returns."""
  file, arg = config.split(":", 1)
  path = file if os.path.isabs(file) else os.path.join(repo_root, file)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {file!r} does not exist (under {repo_root})")
  if repo_root not in sys.path:
    sys.path.insert(0, repo_root)  # config files import `experiments.configs.common`
  spec = importlib.util.spec_from_file_location(f"_config_{os.path.basename(path)[:-3]}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def validate_run(run: Run, repo_root: str = REPO_ROOT) -> None:
  """Raises ValueError naming the run and key for an override the config does not have or a value of the wrong type."""
  config = load_config(run.config, repo_root)
  for dotted, value in run.overrides.items():
    try:
      node, leaf = run_config.resolve(config, dotted)
    except KeyError:
      raise ValueError(f"run {run.name}: unknown sweep key {dotted!r} (not in {run.config})") from None
    current = node[leaf]
    ok = (isinstance(value, bool) == isinstance(current, bool) and
          (isinstance(value, type(current)) or (isinstance(current, float) and isinstance(value, int)) or
           (isinstance(current, (tuple, list)) and isinstance(value, (tuple, list)))))
    if not ok:
      raise ValueError(f"run {run.name}: sweep key {dotted!r} expects {type(current).__name__}, got {value!r}")


# ------------------------------------------------------------------------------------------------ budgets and steps
def run_config_of(run: Run, repo_root: str = REPO_ROOT):
  """The run's config with its overrides applied (as `experiments/train.py` would build it)."""
  config = load_config(run.config, repo_root)
  config.unlock()
  run_config.set_all(config, dict(run.overrides))
  return config


def rl_trajectory_budget(run: Run, repo_root: str = REPO_ROOT) -> int:
  """RL trajectories the run consumes: `total_steps × rollout.batch_size` (see the module docstring)."""
  config = run_config_of(run, repo_root)
  return int(config.total_steps) * int(config.rollout.batch_size)


def expected_last_step(run: Run, repo_root: str = REPO_ROOT) -> int:
  """The trainer's last logged step for a finished run: value pretraining steps (SAO) + `total_steps` − 1."""
  config = run_config_of(run, repo_root)
  pretrain = config.recipe.value_pretrain_steps if config.learner.algorithm == "sao" else 0
  return int(pretrain + config.total_steps - 1)


def check_equal_budgets(run_list: Sequence[Run], repo_root: str = REPO_ROOT) -> int:
  """Returns the shared RL trajectory budget; ValueError naming each run's budget when they differ."""
  budgets = {r.name: rl_trajectory_budget(r, repo_root) for r in run_list}
  if len(set(budgets.values())) != 1:
    raise ValueError(f"sweep: unequal RL rollout budgets (total_steps × rollout.batch_size trajectories): {budgets}")
  return next(iter(budgets.values()))


# ---------------------------------------------------------------------------------------------------- code version
VERSION_FILE = "code_version.json"


def _git(args: Sequence[str], repo_root: str) -> bytes:
  try:
    return subprocess.run(["git", *args], cwd=repo_root, capture_output=True, check=True, timeout=60).stdout
  except (OSError, subprocess.CalledProcessError) as e:
    detail = e.stderr.decode(errors="replace").strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
    raise RuntimeError(f"code version: `git {' '.join(args)}` failed in {repo_root!r} ({detail}); sweeps record "
                       "the commit of a git checkout") from e


def code_version(repo_root: str = REPO_ROOT) -> str:
  """`<commit>` of the checkout, or `<commit>+dirty.<12 hex of sha256(git diff HEAD)>` when tracked files differ."""
  commit = _git(["rev-parse", "HEAD"], repo_root).decode().strip()
  diff = _git(["diff", "HEAD", "--binary"], repo_root)
  return f"{commit}+dirty.{hashlib.sha256(diff).hexdigest()[:12]}" if diff else commit


def read_code_version(run_dir: str) -> str | None:
  """The version stamped in `run_dir` (None when it has no stamp)."""
  path = os.path.join(run_dir, VERSION_FILE)
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)["version"]


def check_code_versions(run_dirs: Sequence[str], version: str) -> None:
  """ValueError listing every run directory stamped with a version other than `version`."""
  other = {d: v for d in run_dirs if (v := read_code_version(d)) is not None and v != version}
  if other:
    raise ValueError(f"sweep: this checkout is code version {version}, but runs of this sweep were made by other "
                     f"versions: {other}. One sweep's runs must share a version: check out that commit, or run the "
                     "sweep in a new --workdir")


def stamp_code_version(run_dir: str, version: str) -> None:
  """Writes `version` into `run_dir/code_version.json`; ValueError if the directory holds another version."""
  check_code_versions([run_dir], version)
  os.makedirs(run_dir, exist_ok=True)
  with open(os.path.join(run_dir, VERSION_FILE), "w", encoding="utf-8") as f:
    json.dump({"version": version, "commit": version.split("+", 1)[0]}, f)
