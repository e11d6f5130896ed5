r"""The accelerator check: one command a GPU (or TPU) machine runs in one call of under 9 minutes, every row in a
process of its own with its own time limit, so a hang or an out-of-memory costs only its slot.

    python experiments/bench/bench_accelerator.py --out=/tmp/accel.jsonl            # the accelerator's rows
    python experiments/bench/bench_accelerator.py --tiny --out=/tmp/accel_tiny.jsonl  # every row at toy sizes, CPU

The device machine (Python 3.12, its own jax; the project's pure-Python dependencies travel as wheels, fetched here
by `experiments/bench/device_wheels.sh` into `.device_wheels/`) runs, from the repository root (not yet run on a
GPU; docs/performance_accelerator.md):

    PIP_BREAK_SYSTEM_PACKAGES=1 python -m pip install -q --no-index --no-deps .device_wheels/*.whl && \
      PYTHONPATH=$PWD python experiments/bench/bench_accelerator.py --out=$OUT/accel.jsonl --cache_dir=.bench_cache/xla

Rows, in priority order (`--rows` picks some; `--tiny` shrinks each to seconds on a CPU):

  dense_8x4096   SAO update of the dense Qwen3-1.7B geometry (vocab 151,936, hidden 2,048, 28 layers, 16 q / 8 kv
                 heads of 128, MLP 6,144, tied embeddings; bf16 compute, float32 params, remat "full", scan_layers),
                 B × T = 8 × 4,096
  dense_1x32768  the same at 1 × 32,768
  moe_30b_a3b    Qwen3-30B-A3B's layer geometry (32 q / 4 kv heads of 128, hidden 2,048, 128 experts of width 768,
                 top-8) at the most layers whose actor + critic + AdamW state fits half the device's memory
                 (`accelerator_rows.moe_layers_that_fit`; the other half for activations and the MoE's temporaries),
                 B × T = 4 × 4,096
  main_job       the README main job, `experiments/train.py --config=experiments/configs/sao_openswe.py:toy` for 10
                 RL steps, its progress lines timed
  decode_b64     the local JAX engine's program (`Sampler.generate`) at batch 64 for the 1.7B geometry (bf16
                 params), prompt 1,024, 128 new tokens: prefill and decode tokens/s apart
  kernels        the candidate kernels forward + backward: the grouped matmul's impls at G = 8, 32, 128 experts,
                 attention as sao's two, cuDNN's and Pallas's (GPU) at T = 4,096 and 32,768 (accelerator_kernels)

Every row prints one line per record and appends it to `--out` as JSON: `backend` (JAX's version, the backend, the
device kind, import and backend-init seconds), `peak_matmul` (a bf16 `[n, n] @ [n, n]` timed in the row's own
process), `params` (init seconds, counts, memory), `compile` (each XLA program's compile seconds and whether JAX's
persistent compilation cache served it), `update` (each update's wall time, compiles, tokens/s, FLOP/s and its
ratio to the peak, peak device memory from `device.memory_stats()`, null where the backend reports none), `summary`;
then the parent's `status` record: ok, failed (exit status and the tail of its output), or timeout. The FLOP
convention is `accelerator_probe`'s (bench_train.py's: 6·P·tokens per training step, 2·P·tokens per forward, P the
active parameters, attention's T² term left out).
"""
from __future__ import annotations

import collections
import os
import sys
import tempfile
import time

from absl import app, flags, logging

# the repository, two folders up: this checkout's `sao` and `experiments`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
REPO = sys.path[0]

from sao.engines import host_platform  # noqa: E402  (imports no JAX)

host_platform.pin_cpu_without_accelerator()  # before JAX is imported: no libtpu probing on a CPU-only host

from experiments.bench import accelerator_kernels as kernels_lib  # noqa: E402
from experiments.bench import accelerator_probe as probe  # noqa: E402
from experiments.bench import accelerator_rows as rows_lib  # noqa: E402

# Row name → its time limit on the accelerator (seconds, the row's process included: imports, backend, compiles).
# The sum, 530 s, stays under the 9-minute call; `--budget_s` trims the later rows if earlier ones ran long (a row
# stopped at its limit may take 10 s more to end).
ROW_LIMITS_S = {"dense_8x4096": 105, "dense_1x32768": 85, "moe_30b_a3b": 100, "main_job": 105, "decode_b64": 75,
                "kernels": 60}
TINY_LIMIT_S = 240  # per row with --tiny: a loaded 2-core CI machine
MAIN_JOB_ARG = "experiments/configs/sao_openswe.py:toy,total_steps=10,rollout.base_eval_repeats=1"
# --tiny: the fewest steps the toy config allows, each phase once (1 SFT step, 1 value-pretraining step, 1 RL step),
# on 8 trajectories of a 16-number search with 2 validation episodes.
TINY_MAIN_JOB_ARG = ("experiments/configs/sao_openswe.py:toy,total_steps=1,recipe.value_pretrain_steps=1,"
                     "learner.sao.critic_warmup_steps=1,recipe.sft_steps=1,recipe.num_demonstrations=50,"
                     "rollout.eval_every=100,rollout.batch_size=8,rollout.concurrency=8,rollout.max_new_tokens=16,"
                     "rollout.max_total_tokens=160,env.kwargs.n=16,env.num_validation_tasks=2,"
                     "rollout.base_eval_repeats=1,checkpoint_every=100")
# A measuring row's share of a GPU's memory (JAX preallocates 75 % by default; the MoE row's depth is planned on
# `memory_stats()['bytes_limit']`, which this raises to 95 %). Unset where the caller set it; not for main_job.
MEASURING_MEM_FRACTION = "0.95"
TIMEOUT_STATUS = 124  # a row's own exit status when it stopped something at its limit (as `timeout` exits)


def define_flags() -> None:
  """Defined when the command runs (tests import every command in one process)."""
  global _OUT, _TINY, _ROWS, _ROW, _LIMIT, _BUDGET, _CACHE_DIR, _WORKDIR  # pylint: disable=global-statement
  _OUT = flags.DEFINE_string("out", "", "JSON-lines file the rows append to ('' = print only)")
  _TINY = flags.DEFINE_bool("tiny", False, "every row at toy sizes (CPU, seconds each)")
  _ROWS = flags.DEFINE_list("rows", list(ROW_LIMITS_S), "rows to run, in this order")
  _ROW = flags.DEFINE_string("row", "", "internal: run this one row in this process")
  _LIMIT = flags.DEFINE_float("limit_s", 0.0, "internal: this row's time limit")
  _BUDGET = flags.DEFINE_float("budget_s", 530.0, "wall-clock budget of all rows together (not with --tiny)")
  _CACHE_DIR = flags.DEFINE_string("cache_dir", "", "JAX persistent compilation cache of the learner and decode "
                                   "rows ('' = <sao cache>/xla/bench_accelerator)")
  _WORKDIR = flags.DEFINE_string("workdir", "", "main_job's run directory ('' = a fresh temporary one)")


# ------------------------------------------------------------------------------------------------- one row
def run_row(name: str) -> int:
  """The body of one row's process; returns its exit status."""
  record = probe.Recorder(_OUT.value, name)
  tiny = _TINY.value
  if name == "main_job":  # the job's own processes take the accelerator: this one never initialises a backend
    import jax  # pylint: disable=g-import-not-at-top
    record("backend", jax_version=jax.__version__, python=sys.version.split()[0], backend="(not initialised here)")
    workdir = _WORKDIR.value or tempfile.mkdtemp(prefix="bench_accelerator_job_")
    finished = rows_lib.main_job_row(record, REPO, TINY_MAIN_JOB_ARG if tiny else MAIN_JOB_ARG, workdir,
                                     max(_LIMIT.value - 15.0, 1.0))
    return 0 if finished else TIMEOUT_STATUS
  start = time.perf_counter()
  import jax  # pylint: disable=g-import-not-at-top
  import_s = time.perf_counter() - start
  probe.enable_compilation_cache(_CACHE_DIR.value or _default_cache_dir())
  compiles = probe.CompileLog(record)
  device = probe.backend_info(record, import_s)
  n = 256 if tiny else 8192
  compiles.during = "peak_matmul"
  peak = probe.matmul_peak(n)
  record("peak_matmul", n=n, dtype="bfloat16", flops_per_s=peak)
  compiles.take()
  if name in ("dense_8x4096", "dense_1x32768"):
    config = rows_lib.tiny_config("qwen3", rows_lib.TINY_DENSE) if tiny else rows_lib.model_config(rows_lib.QWEN3_1P7B)
    shape = {"dense_8x4096": (8, 4096), "dense_1x32768": (1, 32768)}[name]
    if tiny:
      shape = {"dense_8x4096": (2, 64), "dense_1x32768": (1, 128)}[name]
    rows_lib.learner_row(record, device, compiles, config, rows_lib.LearnerRow(*shape, updates=3), peak)
  elif name == "moe_30b_a3b":
    capacity = probe.peak_memory(device)["bytes_limit"] or rows_lib.H200_BYTES
    layers, plan = rows_lib.moe_layers_that_fit(rows_lib.H200_BYTES if tiny else capacity)
    record("plan", layers=layers, **plan)
    if layers < 1:
      raise ValueError(f"moe_30b_a3b: not one layer's state fits half of {plan['capacity_gb']} GB")
    if tiny:
      config = rows_lib.tiny_config("qwen3_moe", rows_lib.TINY_MOE)
      shape = (2, 64)
    else:
      config = rows_lib.model_config(rows_lib.QWEN3_30B_A3B, num_layers=layers)
      shape = (4, 4096)
    rows_lib.learner_row(record, device, compiles, config, rows_lib.LearnerRow(*shape, updates=3), peak)
  elif name == "decode_b64":
    bf16 = dict(dtype="bfloat16", param_dtype="bfloat16", remat="none", scan_layers=False)
    if tiny:
      config = rows_lib.tiny_config("qwen3", rows_lib.TINY_DENSE, **bf16)
      rows_lib.decode_row(record, device, compiles, config, batch=4, prompt=16, new_tokens=32, repeats=3)
    else:
      config = rows_lib.model_config(rows_lib.QWEN3_1P7B, **bf16)
      rows_lib.decode_row(record, device, compiles, config, batch=64, prompt=1024, new_tokens=128, repeats=3)
  elif name == "kernels":
    kernels_lib.kernels_row(record, peak, tiny)
  else:
    raise ValueError(f"--row: unknown row {name!r}; expected one of {list(ROW_LIMITS_S)}")
  return 0


def _default_cache_dir() -> str:
  from sao.engines import compilation_cache  # pylint: disable=g-import-not-at-top
  return os.path.join(compilation_cache.default_dir(), "bench_accelerator")


# ------------------------------------------------------------------------------------------------- the parent
def runtime_dependencies() -> tuple[dict[str, str], list[str]]:
  """({distribution: installed version}, [setup.py's runtime requirements not installed]), read from setup.py's
  INSTALL_REQUIRES without running it. Versions outside the pins are shown, not refused (the device image's jax is
  newer than the pin)."""
  import ast  # pylint: disable=g-import-not-at-top
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  requires = next(ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", "") == "INSTALL_REQUIRES" for t in node.targets))
  installed, missing = {}, []
  for requirement in requires:
    name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]
    try:
      installed[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      missing.append(name)
  return installed, missing


def run_all() -> int:
  """Each row in a process of its own, in order, under its limit (trimmed to the budget left); the parent records a
  `status` per row and never stops early."""
  import jax  # pylint: disable=g-import-not-at-top  (the version only: no backend is initialised here)
  unknown = [r for r in _ROWS.value if r not in ROW_LIMITS_S]
  if unknown:
    raise app.UsageError(f"--rows: unknown {unknown}; expected some of {list(ROW_LIMITS_S)}")
  start = time.perf_counter()
  record = probe.Recorder(_OUT.value, "check", start)
  record("start", jax_version=jax.__version__, python=sys.version.split()[0], tiny=_TINY.value, rows=_ROWS.value,
         jax_platforms=os.environ.get("JAX_PLATFORMS", ""), argv=" ".join(sys.argv[1:]))
  installed, missing = runtime_dependencies()
  record("environment", installed=installed, missing=missing)
  statuses = {}
  for name in _ROWS.value:
    limit = TINY_LIMIT_S if _TINY.value else min(ROW_LIMITS_S[name], _BUDGET.value - (time.perf_counter() - start))
    if limit < 20:
      statuses[name] = "skipped"
      probe.Recorder(_OUT.value, name, start)("status", status="skipped", reason="the check's budget is spent")
      continue
    command = [sys.executable, "-u", os.path.abspath(__file__), f"--row={name}", f"--limit_s={limit}",
               f"--out={_OUT.value}", f"--tiny={_TINY.value}", f"--cache_dir={_CACHE_DIR.value}",
               f"--workdir={_WORKDIR.value}"]
    tail = collections.deque(maxlen=40)

    def on_line(line: str, tail=tail) -> None:
      tail.append(line)
      print(line, flush=True)

    env = dict(os.environ)
    if name != "main_job":  # the job runs as a user runs it; a measuring row may take the whole device
      env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", MEASURING_MEM_FRACTION)
    row_start = time.perf_counter()
    returncode, timed_out = probe.run_streaming(command, limit, on_line, cwd=REPO, env=env)
    status = "timeout" if timed_out or returncode == TIMEOUT_STATUS else "ok" if returncode == 0 else "failed"
    statuses[name] = status
    row_record = probe.Recorder(_OUT.value, name, start)
    row_record("status", status=status, returncode=returncode, limit_s=round(limit, 1),
               wall_s=round(time.perf_counter() - row_start, 2), tail=[] if status == "ok" else list(tail))
  record("end", wall_s=round(time.perf_counter() - start, 2), statuses=statuses)
  return 0 if all(s == "ok" for s in statuses.values()) else 1


def main(argv):
  del argv
  sys.exit(run_row(_ROW.value) if _ROW.value else run_all())


if __name__ == "__main__":
  define_flags()
  logging.set_verbosity(logging.WARNING)  # the learner's parameter tables would bury the rows' lines
  app.run(main)
