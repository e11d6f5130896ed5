"""A discrete-event simulator of the rollout fleet: thousands of agent loops, the engines and the trainer under a
simulated clock, driving the project's own dispenser, buffer, flow control and admission (`sao.transport`).

  distributions  the random durations (episode setup, turns, generation, tools, trainer steps)
  model          the simulated fleet's settings (`FleetConfig`) and the episode/engine model
  stalls         engine stalls: intervals in which the engines serve nobody (`StallModel`, `StallSchedule`)
  contention     the engines' speed over time: stalled, slowed while the trainer computes, or full (`EngineClock`)
  fleet          the event loop (`simulate`)
  report         what a run measured (`FleetReport`): throughput, busy fraction, staleness, discarded work
  validation     predictions against `experiments/bench/bench_pipeline.py` measurements of the real pipeline
  bench_stalls   the engine's stalls in such a measurement, from its trajectory records
  bench_contention  the engine's per-turn time outside and inside the trainer's steps in such a measurement

docs/fleet_simulation.md describes the model, what it finds and how it was validated.
"""
