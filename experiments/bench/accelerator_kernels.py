"""The accelerator check's last row, `kernels`: the candidates for attention and the MoE's grouped matmul on the
device, timed forward + backward in one process, so that one GPU call gives the numbers to pick each platform's
kernel by (issue 47: "measure and pick").

Attention, causal GQA at the 1.7B geometry (16 q / 8 kv heads of 128), B = 1, bf16, T = 4,096 and 32,768:
  sao_auto       `sao.models.attention.attention(..., "auto")`, what the model runs on this platform (its record
                 names the choice: cudnn on a GPU with cuDNN, behind the right-padding cond)
  sao_xla        `sao.models.attention.dense_attention` (full scores; skipped at T = 32,768: 64 GiB of them)
  sao_blockwise  `sao.models.attention.blockwise_attention` (online softmax in jnp, its own VJP)
  cudnn          `jax.nn.dot_product_attention(implementation="cudnn")` (needs cuDNN: skipped elsewhere)
  pallas_gpu     `jax.experimental.pallas.ops.gpu.attention.mha` (Triton), K/V repeated to the query heads (GPU only)
FLOPs of one forward + backward: 7·B·H·T²·D (causal: half of 4·B·H·T²·D a forward; the backward 2.5 forwards).

Grouped matmul (`sao.models.grouped_matmul`), M = 16,384 rows of K = 2,048 into N = 768, G = 8, 32, 128 equal groups,
bf16, forward + both gradients: impl "auto" (the platform's choice), "tiled", "xla" and "ragged_dot" (jax's own
autodiff). FLOPs: 3 · 2·M·K·N.
Each measurement records its compile seconds, the compiled program's temporaries (`memory_analysis()`), the median
of 3 timed calls and FLOP/s, or the error that stopped it (an out-of-memory costs only its measurement).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

# the repository, two folders up: this checkout's `sao` and `experiments`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.bench import accelerator_probe as probe  # noqa: E402

ATTENTION = dict(heads=16, kv_heads=8, head_dim=128, lengths=(4096, 32768))
TINY_ATTENTION = dict(heads=4, kv_heads=2, head_dim=16, lengths=(128,))
GROUPED = dict(rows=16384, contracting=2048, out=768, groups=(8, 32, 128))
TINY_GROUPED = dict(rows=256, contracting=32, out=16, groups=(4,))
XLA_MAX_LENGTH = 8192  # full scores beyond: [H, T, T] float32 = 64 GiB at T = 32,768


def _time(record: probe.Recorder, kind: str, name: str, fn: Callable, args: tuple, flops: float,
          peak: float, **fields: Any) -> None:
  """Compiles `fn(*args)`, runs it 3 times and records the median, or records the error."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  try:
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    temp = getattr(memory, "temp_size_in_bytes", None) if memory is not None else None
    jax.block_until_ready(compiled(*args))
    walls = []
    for _ in range(3):
      start = time.perf_counter()
      jax.block_until_ready(compiled(*args))
      walls.append(time.perf_counter() - start)
    wall = float(np.median(walls))
    record(kind, impl=name, status="ok", compile_s=round(compile_s, 3), temp_bytes=temp, median_s=round(wall, 6),
           flops=flops, flops_per_s=flops / wall, ratio_to_peak=round(flops / wall / peak, 4), **fields)
  except Exception as e:  # pylint: disable=broad-except  (an OOM or a lowering error is this measurement's result)
    record(kind, impl=name, status="failed", error=f"{type(e).__name__}: {str(e)[:300]}", **fields)


def attention_kernels(record: probe.Recorder, peak: float, tiny: bool) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from sao.models import attention as attn  # pylint: disable=g-import-not-at-top
  shape = TINY_ATTENTION if tiny else ATTENTION
  h, kv, d = shape["heads"], shape["kv_heads"], shape["head_dim"]
  gpu = jax.default_backend() == "gpu"  # which candidates this device can run at all (cuDNN, Triton)
  for t in shape["lengths"]:
    keys = jax.random.split(jax.random.PRNGKey(t), 3)
    q = jax.random.normal(keys[0], (1, t, h, d), jnp.bfloat16)
    k = jax.random.normal(keys[1], (1, t, kv, d), jnp.bfloat16)
    v = jax.random.normal(keys[2], (1, t, kv, d), jnp.bfloat16)
    valid = jnp.ones((1, t), bool)
    platform = "cuda" if gpu else jax.default_backend()
    chosen = attn.platform_impls("auto", q, k, cached=False)[platform]
    candidates = {
        # what the model runs here ("auto": the platform's choice, `chosen`); on a GPU cuDNN behind the padding cond
        "sao_auto": lambda q, k, v: attn.attention(q, k, v, attn.AttentionMask(valid), "auto"),
        "sao_xla": lambda q, k, v: attn.dense_attention(q, k, v, attn.AttentionMask(valid).dense(q.shape[1])),
        "sao_blockwise": lambda q, k, v: attn.blockwise_attention(q, k, v, attn.AttentionMask(valid)),
        "cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn"),
        "pallas_gpu": lambda q, k, v: _pallas_mha(q, k, v, d),
    }
    for name, forward in candidates.items():
      if t > XLA_MAX_LENGTH and (name == "sao_xla" or (name == "sao_auto" and chosen == "xla")):
        record("attention", impl=name, status="skipped", reason=f"T > {XLA_MAX_LENGTH}: full scores", seq_len=t)
        continue
      if name in ("cudnn", "pallas_gpu") and not gpu:
        record("attention", impl=name, status="skipped", reason="not a GPU", seq_len=t)
        continue
      loss = lambda q, k, v, f=forward: jnp.sum(f(q, k, v).astype(jnp.float32))
      extra = {"chosen": chosen} if name == "sao_auto" else {}
      _time(record, "attention", name, jax.grad(loss, argnums=(0, 1, 2)), (q, k, v), 7.0 * h * t * t * d, peak,
            seq_len=t, heads=h, kv_heads=kv, head_dim=d, **extra)


def _pallas_mha(q, k, v, head_dim: int):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.gpu import attention as pallas_attention  # pylint: disable=g-import-not-at-top
  repeat = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, repeat, axis=2), jnp.repeat(v, repeat, axis=2)
  return pallas_attention.mha(q, k, v, segment_ids=None, sm_scale=head_dim ** -0.5, causal=True)


def grouped_matmul_kernels(record: probe.Recorder, peak: float, tiny: bool) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from sao.models import grouped_matmul as gm  # pylint: disable=g-import-not-at-top
  shape = TINY_GROUPED if tiny else GROUPED
  m, k, n = shape["rows"], shape["contracting"], shape["out"]
  for g in shape["groups"]:
    keys = jax.random.split(jax.random.PRNGKey(g), 2)
    lhs = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    rhs = jax.random.normal(keys[1], (g, k, n), jnp.bfloat16)
    sizes = jnp.full((g,), m // g, jnp.int32)
    for impl in ("auto", "tiled", "xla", "ragged_dot"):  # auto: the platform's choice (tiled on CPU and GPU)
      loss = lambda a, b, s, impl=impl: jnp.sum(gm.grouped_matmul(a, b, s, impl).astype(jnp.float32))
      _time(record, "grouped_matmul", impl, jax.grad(loss, argnums=(0, 1)), (lhs, rhs, sizes), 3 * 2.0 * m * k * n,
            peak, rows=m, contracting=k, out=n, groups=g)


def kernels_row(record: probe.Recorder, peak: float, tiny: bool) -> None:
  grouped_matmul_kernels(record, peak, tiny)  # first: the MoE's choice is the one a measurement decides alone
  attention_kernels(record, peak, tiny)
  record("summary", measured="grouped_matmul and attention forward + backward (this module's docstring)")
