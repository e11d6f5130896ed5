"""`learner.routing_replay` reaches both ends of the embedded run: the engines get SGLang's
`--enable-return-routed-experts`, the workers' engine clients ask for routed experts; off, neither."""
from __future__ import annotations

from experiments.configs import sao_openswe
from launch import embedded
from sao.rollout import worker as worker_lib


def test_routing_replay_switches_engines_and_workers():
  on = sao_openswe.get_config("toy")
  on.learner.routing_replay = True
  off = sao_openswe.get_config("toy")
  assert embedded.engine_args(on, "/c")[-1] == "--enable-return-routed-experts"
  assert "--enable-return-routed-experts" not in embedded.engine_args(off, "/c")
  assert worker_lib.worker_config(on, "t:1").return_routed_experts
  assert not worker_lib.worker_config(off, "t:1").return_routed_experts
