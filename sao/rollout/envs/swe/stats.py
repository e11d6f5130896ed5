"""Statistics of a SWE dataset (the generated one by default), and an end-to-end check of its instances.

    python -m sao.rollout.envs.swe.stats                        # the generated dataset (240 repositories)
    python -m sao.rollout.envs.swe.stats --num_repos 480
    python -m sao.rollout.envs.swe.stats --jsonl x.jsonl --snapshot_root repos/
    python -m sao.rollout.envs.swe.stats --verify 20            # grade empty + gold patches of 20 instances

`--verify` checks each instance the way SWE-bench validates its data: with no patch, every FAIL_TO_PASS test fails
(and the grade is 0); with the gold patch the grade is 1.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
from typing import Any, Sequence

from sao.rollout.envs.base import SPLITS, split_of
from sao.rollout.envs.swe import grader as grader_lib
from sao.rollout.envs.swe import sandbox as sandbox_lib
from sao.rollout.envs.swe.dataset import Instance
from sao.transport.trajectory import Status


def _summary(values: Sequence[float]) -> str:
  return (f"mean {statistics.fmean(values):.1f}, median {statistics.median(values):g}, "
          f"range {min(values):g}-{max(values):g}")


def dataset_stats(tasks: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Counts and distributions over `tasks` (env tasks, as `SweEnv.task_pool()` returns)."""
  instances = [Instance.from_task(t) for t in tasks]
  repos = sorted({i.repo for i in instances})
  split_repos = collections.Counter(split_of(r) for r in repos)
  split_instances = collections.Counter(split_of(i.repo) for i in instances)
  out: dict[str, Any] = {
      "instances": len(instances), "repositories": len(repos),
      "splits": {s: {"repositories": split_repos.get(s, 0), "instances": split_instances.get(s, 0)} for s in SPLITS},
      "fail_to_pass": _summary([len(i.fail_to_pass) for i in instances]),
      "pass_to_pass": _summary([len(i.pass_to_pass) for i in instances]),
      "problem_statement_words": _summary([len(i.problem_statement.split()) for i in instances]),
      "gold_patch_lines": _summary([sum(1 for line in i.patch.splitlines() if line[:1] in "+-"
                                        and not line.startswith(("+++", "---"))) for i in instances if i.patch]
                                   or [0]),
  }
  kinds = collections.Counter(t.get("bug_kind") for t in tasks if t.get("bug_kind"))
  if kinds:
    out["bug_kinds"] = dict(kinds.most_common())
  try:
    from sao.rollout.envs.swe import generator
    specs = [generator.spec(int(t["snapshot"]["path"].split("/")[1])) for t in tasks
             if t["snapshot"]["kind"] == "generated"]
  except (ImportError, ValueError, IndexError):
    specs = []
  if specs:
    out["python_files_per_repo"] = _summary([sum(p.endswith(".py") for p in s.files) for s in specs])
    out["lines_per_repo"] = _summary([sum(text.count("\n") for text in s.files.values()) for s in specs])
    out["distinct_library_bugs"] = len({generator.bug_slot(s.index) for s in specs})
  return out


def format_stats(stats: dict[str, Any]) -> str:
  """A markdown table of `dataset_stats`."""
  rows = ["| statistic | value |", "|---|---|"]
  for key, value in stats.items():
    if key == "splits":
      value = ", ".join(f"{s} {v['repositories']} repos / {v['instances']} instances" for s, v in value.items())
    elif isinstance(value, dict):
      value = ", ".join(f"{k} {v}" for k, v in value.items())
    rows.append(f"| {key.replace('_', ' ')} | {value} |")
  return "\n".join(rows)


async def averify(instances: Sequence[Instance], config: sandbox_lib.SandboxConfig, concurrency: int = 4
                  ) -> list[str]:
  """Problems found by grading each instance without a patch (must be 0, FAIL_TO_PASS failing, PASS_TO_PASS
  passing) and with its gold patch (must be 1). Empty when every instance is sound."""
  gate = asyncio.Semaphore(concurrency)

  async def check(instance: Instance) -> list[str]:
    async with gate:
      problems = []
      empty = await grader_lib.agrade(instance, "", config)
      if empty.status != Status.OK or empty.reward != 0.0:
        problems.append(f"{instance.instance_id}: without a patch: {empty.status} reward {empty.reward}")
      elif any(empty.tests[t] for t in instance.fail_to_pass) or not all(empty.tests[t] for t in instance.pass_to_pass):
        problems.append(f"{instance.instance_id}: without a patch, FAIL_TO_PASS/PASS_TO_PASS outcomes are wrong")
      if instance.patch:
        gold = await grader_lib.agrade(instance, instance.patch, config)
        if not gold.resolved:
          problems.append(f"{instance.instance_id}: the gold patch does not resolve it: {gold.detail}")
      return problems

  return [p for ps in await asyncio.gather(*(check(i) for i in instances)) for p in ps]


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--num_repos", type=int, default=240)
  parser.add_argument("--jsonl")
  parser.add_argument("--snapshot_root")
  parser.add_argument("--verify", type=int, default=0, help="grade empty and gold patches of this many instances")
  args = parser.parse_args(argv)
  from sao.rollout.envs.swe.env import SweEnv
  env = SweEnv(jsonl=args.jsonl, snapshot_root=args.snapshot_root, num_repos=args.num_repos)
  tasks = env.task_pool()
  print(format_stats(dataset_stats(tasks)))
  if args.verify:
    instances = [Instance.from_task(t) for t in tasks[:args.verify]]
    problems = asyncio.run(averify(instances, env.sandbox_config))
    print(f"\nverified {len(instances)} instances: {len(problems)} problems")
    for p in problems:
      print(" ", p)
    return 1 if problems else 0
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
