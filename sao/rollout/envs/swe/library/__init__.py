"""The module library of the generated SWE dataset (see `library.base` for the types).

`LIBRARY` lists every module template in a fixed order: the generator assigns bugs to repositories by position in
it, so appending keeps existing repositories unchanged while reordering changes them (bump `generator.VERSION`).
"""
from sao.rollout.envs.swe.library.base import BUG_KINDS, Bug, Case, ModuleTemplate
from sao.rollout.envs.swe.library import part1, part2

LIBRARY: tuple[ModuleTemplate, ...] = part1.MODULES + part2.MODULES

__all__ = ["BUG_KINDS", "Bug", "Case", "LIBRARY", "ModuleTemplate"]
