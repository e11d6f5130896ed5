"""Environments for the agent loop: a registry of task families with one interface (`base.Env`).

Importing this package registers the built-in environments: `number_search`, `search_chain`, `slow_number_search`, `code_repair`
and `swe` (SWE-bench-style repositories in sandboxes, `sao.rollout.envs.swe`).
"""
from sao.rollout.envs.base import Demonstration, Env, Message, SPLITS, Task, split_of
from sao.rollout.envs.registry import make, register, registered
from sao.rollout.envs import code_repair as _code_repair  # noqa: F401  (registers "code_repair")
from sao.rollout.envs import number_search as _number_search  # noqa: F401  (registers "number_search")
from sao.rollout.envs import search_chain as _search_chain  # noqa: F401  (registers "search_chain")
from sao.rollout.envs import slow_number_search as _slow_number_search  # noqa: F401  (registers "slow_number_search")
from sao.rollout.envs.swe import env as _swe_env  # noqa: F401  (registers "swe")
from sao.rollout.envs.code_repair import CodeRepair
from sao.rollout.envs.number_search import NumberSearch
