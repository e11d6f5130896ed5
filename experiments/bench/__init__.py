"""Benchmarks and profilers, each run as `python experiments/bench/<name>.py` (the user's entry points, `train.py`,
`evaluate.py`, `reproduce.py`, `compile_tpu.py`, `simulate_fleet.py`, stay one folder up). Each script puts the
repository first on `sys.path`, so it runs this checkout's `sao` without `pip install -e .`.

  bench_accelerator  the accelerator check: every row (1.7B and 30B-A3B-layer learner updates, the main job, the
                     engine's decode) in its own process under its own limit; --tiny on CPU (accelerator_rows,
                     accelerator_probe: its rows and measurements; device_wheels.sh: the device's wheel set)
  bench_train        one learner update's throughput on CPU beside the measured matmul peak
  profile_train      where that update spends its time, and the matmul ceiling its shapes allow
  job_speed          the README main job's RL step time per run, and the ratio of two trees'
  bench_gae          GAE + masked whitening: each implementation's time
  bench_publish      weight publication, from "actor update done" to "engine serving the new version"
  bench_engine_rows  the local engine's cost per row against its batch size
  bench_rollout      rollout throughput: dynamic batching and the prefix cache, each on vs off
  bench_models       the model layer against `transformers` on the same weights
  bench_load         peak host memory of loading an HF checkpoint
  bench_swe_env      SWE environment episodes/s with N concurrent sandboxes
  bench_pipeline     pipeline throughput, fully asynchronous vs synchronous (the fleet simulator's validation input)
  pipeline_recording the pipeline bench's recording trainer and per-mode summary
  compile_layer      one token-mixer block's forward + backward compiled for a TPU topology
  moe_layer_memory   per-chip memory of one routed MoE block compiled for a TPU topology
  hlo_breakdown      a compiled program's optimized HLO priced per instruction kind, model part, phase and bound
  async_collectives_toy  a small sharded program compiled with and without XLA's async collective flags, priced
                     serial and schedule-aware (`sao.aot.hlo_overlap`)
"""
