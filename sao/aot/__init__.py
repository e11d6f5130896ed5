"""Ahead-of-time compile analysis: the learner's programs compiled for a TPU topology on any host, and their HLO
read and priced. `sao.train` imports none of it; it imports `sao.train` (the learner it compiles).

  driver         an abstract `Learner` on the topology's mesh: its update recorded and each program compiled
  report         the compile report's rows, written one by one, with resume (`experiments/compile_tpu.py`)
  compile_stats  FLOPs of a jaxpr, the PaLM model FLOPs, XLA's memory report and buffer dump of a compile
  hlo_text       a parser of optimized HLO text (no jax)
  hlo_flops      matmul FLOPs of HLO instructions (dots, convolutions, kernels' custom calls)
  hlo_cost       an HLO module priced per model part, phase and bound on a chip
  hlo_async      the TPU's async collective fusion (start, carrying fusions, done) in optimized HLO
  hlo_overlap    what a scheduled module's async collectives hide of hlo_cost's serial sum
  tpu_topology   the chip table (`CHIPS`) and a topology's abstract devices from libtpu
"""
