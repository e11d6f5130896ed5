"""SWE-style coding tasks: SWE-bench instances in bubblewrap sandboxes, graded like SWE-bench.

Modules: `dataset` (the SWE-bench JSONL format and repository snapshots), `generator` (the generated dataset of
small Python repositories with planted bugs; `library` holds its module templates, `issues` writes its reports),
`sandbox` (episode directories and isolated commands), `command_output` (a command's bounded output and its
`CommandResult`), `bwrap` (finding/installing bubblewrap), `tools.editor` (OpenHands' `str_replace_editor`), `grader`
(SWE-bench grading), `expert` (scripted demonstrations), `pool` (bounded concurrent episodes), `env` (the "swe" `Env`;
its docstring shows the tool API), `stats` (dataset statistics).
"""
from sao.rollout.envs.swe.command_output import CommandResult
from sao.rollout.envs.swe.dataset import DatasetError, Instance, Snapshot, load_jsonl
from sao.rollout.envs.swe.env import GradeVoidError, SweEnv
from sao.rollout.envs.swe.grader import GradeResult, agrade, grade
from sao.rollout.envs.swe.sandbox import Sandbox, SandboxConfig, SandboxError

__all__ = ["CommandResult", "DatasetError", "GradeResult", "GradeVoidError", "Instance", "Sandbox", "SandboxConfig",
           "SandboxError", "Snapshot", "SweEnv", "agrade", "grade", "load_jsonl"]
