"""`experiments/bench/bench_accelerator.py --tiny` runs every row of the accelerator check to completion on CPU and
writes well-formed JSON lines: the check cannot rot between the runs on a GPU."""
import json
import math
import os
import subprocess
import sys
import time

import pytest

from experiments.bench import accelerator_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = ("dense_8x4096", "dense_1x32768", "moe_30b_a3b", "main_job", "decode_b64", "kernels")
LEARNER_ROWS = ("dense_8x4096", "dense_1x32768", "moe_30b_a3b")

pytestmark = pytest.mark.slow


def _records(path):
  with open(path, encoding="utf-8") as f:
    lines = [line for line in f.read().splitlines() if line.strip()]
  records = [json.loads(line) for line in lines]  # every line is one JSON object
  assert all(isinstance(r, dict) and {"row", "phase", "t"} <= set(r) for r in records), records
  return records


def test_every_row_completes_at_tiny_sizes(tmp_path):
  out = tmp_path / "accel.jsonl"
  result = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "bench", "bench_accelerator.py"),
                           "--tiny", f"--out={out}", f"--workdir={tmp_path / 'job'}",
                           f"--cache_dir={tmp_path / 'xla'}"], capture_output=True, text=True, timeout=900,
                          check=False)
  assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
  records = _records(out)
  by_row = {row: [r for r in records if r["row"] == row] for row in ROWS}
  statuses = {row: [r["status"] for r in rs if r["phase"] == "status"] for row, rs in by_row.items()}
  assert statuses == {row: ["ok"] for row in ROWS}, statuses
  start = next(r for r in records if r["phase"] == "start")
  assert start["tiny"] is True and start["jax_version"]
  environment = next(r for r in records if r["phase"] == "environment")
  assert environment["missing"] == [] and "jax" in environment["installed"]  # setup.py's requirements, all here
  for row in ROWS:  # the version, the backend and the device kind are in the output
    backend = next(r for r in by_row[row] if r["phase"] == "backend")
    assert backend["jax_version"] and f"[{row}] backend: " in result.stdout
  for row in LEARNER_ROWS + ("decode_b64", "kernels"):
    rs = by_row[row]
    backend = next(r for r in rs if r["phase"] == "backend")
    assert backend["backend"] == "cpu" and backend["device_kind"] and backend["init_s"] >= 0
    peak = next(r for r in rs if r["phase"] == "peak_matmul")
    assert peak["dtype"] == "bfloat16" and peak["flops_per_s"] > 0
    compiles = [r for r in rs if r["phase"] == "compile"]
    assert compiles and all(r["seconds"] >= 0 and isinstance(r["cache_hit"], bool) for r in compiles)
  for row in LEARNER_ROWS:
    rs = by_row[row]
    params = next(r for r in rs if r["phase"] == "params")
    assert params["actor_params"] > params["critic_params"] > 0  # the critic has no LM head
    updates = [r for r in rs if r["phase"] == "update"]
    assert [u["index"] for u in updates] == [0, 1, 2]
    assert updates[0]["compiled_programs"] > 0  # the first update compiles the learner's programs ...
    assert all(u["compiled_programs"] == 0 for u in updates[1:])  # ... and the later ones reuse them
    assert all(u["finite"] and u["wall_s"] > 0 and u["flops_per_s"] > 0 and "peak_bytes" in u for u in updates)
    summary = next(r for r in rs if r["phase"] == "summary")
    assert summary["timed_updates"] == 2 and 0 < summary["ratio_to_peak"] and math.isfinite(summary["flops_per_s"])
    assert summary["tokens_per_s"] == pytest.approx(summary["batch"] * summary["seq_len"] / summary["median_update_s"],
                                                    rel=5e-3)
  moe = by_row["moe_30b_a3b"]
  params = next(r for r in moe if r["phase"] == "params")
  assert params["actor_active_params"] < params["actor_params"]  # top-2 of 8 experts
  plan = next(r for r in moe if r["phase"] == "plan")
  assert plan["layers"] >= 1 and plan["state_gb"] <= plan["state_fraction"] * plan["capacity_gb"]
  decode = next(r for r in by_row["decode_b64"] if r["phase"] == "summary")
  assert decode["prefill_tokens_per_s"] > 0 and decode["decode_step_s"] >= 0
  kernels = by_row["kernels"]
  gmm = {(r["impl"], r["groups"]): r["status"] for r in kernels if r["phase"] == "grouped_matmul"}
  assert gmm == {(impl, g): "ok" for impl in ("auto", "tiled", "xla", "ragged_dot") for g in (4,)}, gmm
  attention = {r["impl"]: r["status"] for r in kernels if r["phase"] == "attention"}
  # cuDNN and Pallas's Triton kernel run only on a GPU: on CPU they are recorded as skipped, not run
  assert attention == {"sao_auto": "ok", "sao_xla": "ok", "sao_blockwise": "ok", "cudnn": "skipped",
                       "pallas_gpu": "skipped"}, attention
  assert next(r for r in kernels if r.get("impl") == "sao_auto")["chosen"] == "xla"  # CPU, T = 128
  measured = [r for r in kernels if r["phase"] in ("grouped_matmul", "attention") and r["status"] == "ok"]
  assert len(measured) == 7 and all(r["flops_per_s"] > 0 and r["compile_s"] >= 0 for r in measured)
  job = by_row["main_job"]
  texts = [r["text"] for r in job if r["phase"] == "line"]
  assert any(t.startswith("[sft] step") for t in texts) and any(t.startswith("[rl] step") for t in texts), texts
  summary = next(r for r in job if r["phase"] == "summary")
  assert summary["returncode"] == 0 and not summary["timed_out"] and summary["rl_steps"] == 1


def test_moe_depth_fits_its_share_of_the_device():
  """The MoE row's depth: the most layers whose actor + critic + AdamW state fits the share, one more does not."""
  layers, plan = accelerator_rows.moe_layers_that_fit(141e9)
  per_layer = plan["params_per_layer"]
  fixed = plan["actor_fixed_params"], plan["critic_fixed_params"]

  def state(n):
    return accelerator_rows.learner_state_bytes(fixed[0] + n * per_layer, fixed[1] + n * per_layer)

  assert state(layers) <= 0.5 * 141e9 < state(layers + 1)
  # One layer of the 30B-A3B geometry: attention 2,048 × (32 + 2·4 + 32) · 128 + 128 experts · 3 · 2,048 · 768
  # + the router 2,048 · 128 + q/k norms 2 · 128 + two layer norms 2 · 2,048.
  assert per_layer == 2048 * 72 * 128 + 128 * 3 * 2048 * 768 + 2048 * 128 + 2 * 128 + 2 * 2048
  assert fixed[0] == 2 * 151_936 * 2048 + 2048  # untied embeddings and head, the final norm


def _alive(pid):
  """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def test_a_row_past_its_limit_is_stopped_with_its_output_kept():
  """`run_streaming`, which runs each row: a process still running at the limit is stopped, process group and all
  (a child that ignores the pipe included), and the lines it printed before are kept; a failing one keeps its status."""
  from experiments.bench import accelerator_probe  # pylint: disable=import-outside-toplevel
  lines = []
  hang = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
          "time.sleep(60)']); print(child.pid, flush=True); time.sleep(60)")
  returncode, timed_out = accelerator_probe.run_streaming([sys.executable, "-c", hang], 3.0, lines.append)
  assert timed_out and returncode != 0 and len(lines) == 1
  grandchild = int(lines[0])
  for _ in range(50):  # killed with its group; once its parent is gone, init reaps it
    if not _alive(grandchild):
      break
    time.sleep(0.1)
  else:
    raise AssertionError(f"process {grandchild} outlived its row")
  lines.clear()
  returncode, timed_out = accelerator_probe.run_streaming(
      [sys.executable, "-c", "import sys; print('out of memory'); sys.exit(3)"], 30.0, lines.append)
  assert (returncode, timed_out, lines) == (3, False, ["out of memory"])
