"""`experiments/bench/accelerator_lowering.py`: one SAO update of the routed-MoE toy learner (bf16 compute) runs on
this CPU host, and every program it ran is lowered for cuda (not run: no GPU here). With a GPU host's cuDNN version
query stood in for, the programs that run the model hold cuDNN's fused attention, forward and backward, and none
holds XLA's ragged dot (dense over the experts on GPU); a second update compiles nothing."""
from experiments.bench import accelerator_lowering


def test_moe_update_lowered_for_cuda_uses_cudnn_and_no_ragged_dot():
  report = accelerator_lowering.lower_update("moe", "cuda", seq_len=128, cudnn=True)
  programs = {p["name"]: p for p in report["programs"]}
  assert all(p["lowered"] for p in programs.values()), programs
  assert {"critic_step", "critic_values"} <= set(programs) and any(n.startswith("actor_step") for n in programs)
  for name, p in programs.items():
    assert p["ragged_dot"] == 0, name
    if name.startswith(("actor_step", "critic_step")):
      assert p["cudnn_attention"] > 0 and p["cudnn_attention_backward"] > 0, name
  assert programs["critic_values"]["cudnn_attention"] > 0
  assert report["compiles"]["first"] >= len(programs) - 1 and report["compiles"]["second"] == 0
