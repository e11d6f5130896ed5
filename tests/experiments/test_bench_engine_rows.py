"""`experiments/bench/bench_engine_rows.py` times the engine's program per batch size: one CPU time per call and
round, for every size asked, interleaved (the timing itself is the benchmark's, never asserted)."""
from experiments.bench import bench_engine_rows


def test_measure_times_every_size_every_round():
  seconds = bench_engine_rows.measure([1, 3], prompt=16, new_tokens=2, repeats=2)
  assert sorted(seconds) == [1, 3]
  assert all(len(s) == 2 and all(t >= 0 for t in s) for s in seconds.values())


def test_later_turn_times_every_smallest_suffix_bucket():
  seconds = bench_engine_rows.measure_later_turn(2, [16, 8], prefix=12, suffix=3, new_tokens=2, repeats=2)
  assert sorted(seconds) == [8, 16]
  assert all(len(s) == 2 and all(t >= 0 for t in s) for s in seconds.values())
