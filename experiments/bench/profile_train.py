r"""Where one SAO learner update spends its time on CPU, and the matmul ceiling its shapes allow.

  python experiments/bench/profile_train.py                          # bench_train.py's default model and batch
  python experiments/bench/profile_train.py --batch=8 --seq_len=256 --updates=2

Builds the same learner as `experiments/bench/bench_train.py` (Qwen3 hidden 256, 4 layers, vocab 4096, [8, 256]), runs
one warm-up update, then traces `--updates` updates with `jax.profiler` and sums the XLA:CPU thunk times per HLO op.
Each op is classed from the optimized HLO that XLA dumps (`--xla_dump_to`, set by this script): "matmul" when it is
or fuses a `dot`/`convolution` (its FLOPs counted from the operand shapes), else by its fused computation's
contents (exp/log/tanh = "transcendental", reduce, copy/transpose, dynamic-slice/update, loop control, other).

Then, in the same process, it times every matmul shape of the actor's training step on its own: for each linear layer
`[N, a] @ [a, b]` (N = B·T tokens) the forward product, the input gradient `[N, b] @ [b, a]` and the weight gradient
`[a, N] @ [N, b]`, attention's batched `QKᵀ` and `PV` products (and their gradients' shapes), and the LM head, beside
a `[n, n] @ [n, n]` float32 matmul (`--matmul`, the peak bench_train.py divides by). The FLOP-weighted rate of those
shapes, `Σ flops / Σ (flops / rate)`, over the peak is the ratio an update could reach if everything but its
matmuls were free: the honest ceiling for bench_train.py's MFU-like figure on this machine.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import shutil
import sys
import tempfile
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.bench import synthetic  # noqa: E402
from sao.models.config import ModelConfig
from sao.models.transformer import init_params
from sao.train import config as config_lib
from sao.train.learner import Learner
from sao.train.mesh import make_mesh


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _BATCH, _SEQ_LEN, _UPDATES, _HIDDEN, _LAYERS, _VOCAB, _MATMUL, _REPEATS  # pylint: disable=global-statement
  global _TOP  # pylint: disable=global-statement
  _BATCH = flags.DEFINE_integer("batch", 8, "trajectories per update")
  _SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "tokens per trajectory")
  _UPDATES = flags.DEFINE_integer("updates", 2, "traced updates (after one compile/warm-up update)")
  _HIDDEN = flags.DEFINE_integer("hidden", 256, "hidden size of the Qwen3 config")
  _LAYERS = flags.DEFINE_integer("layers", 4, "decoder layers")
  _VOCAB = flags.DEFINE_integer("vocab", 4096, "vocabulary size")
  _MATMUL = flags.DEFINE_integer("matmul", 2048, "side of the peak-FLOP/s matmul")
  _REPEATS = flags.DEFINE_integer("repeats", 7, "timed calls per matmul shape (best kept, as bench_train's peak)")
  _TOP = flags.DEFINE_integer("top", 15, "slowest ops listed")


def _param_count(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


_trajectories = synthetic.synthetic_trajectories


# ---------------------------------------------------------------------------------------------------- HLO parsing
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+?(?:\[[^\]]*\])?)(?:\{[^}]*\})? ([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^%?([\w.\-]+) .*\{$")
_TRANSCENDENTAL = ("exponential", "log", "tanh", "logistic", "rsqrt", "sqrt", "power", "erf")


def _dims(shape: str) -> list[int]:
  match = re.search(r"\[([\d,]*)\]", shape)
  return [int(d) for d in match.group(1).split(",") if d] if match else []


def _dot_flops(line_rest: str, result_shape: str, shapes: dict[str, str]) -> float:
  """2 · |result| · |contracted dims| of a `dot`, from the lhs operand's shape and its contracting dims."""
  operands = re.findall(r"%([\w.\-]+)", line_rest.split(")")[0])
  contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line_rest)
  if not operands or operands[0] not in shapes or not contracting:
    return 0.0
  lhs = _dims(shapes[operands[0]])
  k = int(np.prod([lhs[int(d)] for d in contracting.group(1).split(",") if d])) if contracting.group(1) else 1
  return 2.0 * float(np.prod(_dims(result_shape))) * k


def parse_module(text: str) -> dict[str, tuple[str, float, str, str]]:
  """`{op name: (class, matmul FLOPs, description, component)}` for the ops of one optimized HLO module."""
  computations: dict[str, list[tuple[str, str, str, str]]] = {}
  current = None
  for line in text.splitlines():
    if not line.startswith(" ") and line.rstrip().endswith("{"):
      match = _COMPUTATION.match(line.replace("ENTRY ", ""))
      current = match.group(1) if match else None
      computations[current] = []
    elif current is not None:
      match = _INSTRUCTION.match(line)
      if match:
        computations[current].append(match.groups())

  def contents(name, seen):
    """(opcodes, matmul FLOPs, dot shapes) of a computation and the computations it calls."""
    if name in seen or name not in computations:
      return set(), 0.0, []
    seen.add(name)
    shapes = {n: s for n, s, _, _ in computations[name]}
    opcodes, flops, dots = set(), 0.0, []
    for _, shape, opcode, rest in computations[name]:
      opcodes.add(opcode)
      if opcode in ("dot", "convolution"):
        f = _dot_flops(rest, shape, shapes)
        flops += f
        dots.append(f"{shape.split('{')[0]}")
      for callee in re.findall(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)", rest):
        o, f, d = contents(callee, seen)
        opcodes |= o
        flops += f
        dots += d
    return opcodes, flops, dots

  # Thunks run the ops of the entry computation and of loop bodies and branches; the insides of fusions and the
  # reducers of reductions never run as ops of their own.
  inner = {callee for computation in computations.values() for _, _, _, rest in computation
           for callee in re.findall(r"(?:calls|to_apply)=%([\w.\-]+)", rest)}
  ops = {}
  for name, computation in computations.items():
    if name in inner:
      continue
    shapes = {n: s for n, s, _, _ in computation}
    for op, shape, opcode, rest in computation:
      if opcode in ("parameter", "constant", "get-tuple-element", "tuple", "bitcast"):
        continue
      opcodes, flops, dots = {opcode}, 0.0, []
      if opcode in ("dot", "convolution"):
        flops, dots = _dot_flops(rest, shape, shapes), [shape.split("{")[0]]
      if opcode == "fusion" or opcode == "custom-call":
        for callee in re.findall(r"calls=%([\w.\-]+)", rest):
          o, f, d = contents(callee, set())
          opcodes |= o
          flops += f
          dots += d
      op_name = re.search(r'op_name="([^"]*)"', rest)
      ops[op] = (_classify(opcodes, opcode), flops, ", ".join(dots) or shape.split("{")[0],
                 _component(op_name.group(1) if op_name else ""))
  return ops


_COMPONENTS = (("self_attn", "attention (projections, scores, softmax)"), ("mlp", "MLP"),
               ("norm", "RMS norms"), ("logprob", "log-probs (LM head, log-softmax)"),
               ("lm_head", "log-probs (LM head, log-softmax)"), ("value_head", "value head"),
               ("embed", "embeddings"), ("adam", "optimizer"), ("optax", "optimizer"), ("clip", "optimizer"))


def _component(op_name: str) -> str:
  """The model part an HLO op comes from, by the JAX name scope in its metadata."""
  for key, component in _COMPONENTS:
    if key in op_name:
      return component
  return "other (LM head, losses, advantages, glue)"  # the head's matmuls carry no "lm_head" scope here


def _classify(opcodes: set[str], opcode: str) -> str:
  if opcodes & {"dot", "convolution"}:
    return "matmul"
  if opcode in ("while", "conditional", "call"):
    return "loop/cond control"
  if opcodes & set(_TRANSCENDENTAL):
    return "transcendental (exp, log, rsqrt...)"
  if opcodes & {"reduce", "reduce-window"}:
    return "reduction"
  if opcodes & {"dynamic-slice", "dynamic-update-slice", "gather", "scatter"}:
    return "slice/update/gather"
  if opcodes <= {"copy", "transpose", "concatenate", "slice", "pad", "reshape", "broadcast", "fusion", "iota",
                 "select", "convert"}:
    return "copy/transpose/broadcast"
  return "other elementwise"


def hlo_modules(dump_dir: str) -> list[tuple[str, dict[str, tuple[str, float, str, str]]]]:
  """`[(module name, {op name: (class, FLOPs, description, component)})]` for every optimized module dumped."""
  modules = []
  for path in sorted(glob.glob(os.path.join(dump_dir, "*after_optimizations.txt"))):
    text = open(path).read()
    header = re.match(r"HloModule ([\w.\-]+)", text)
    if header:
      modules.append((header.group(1), parse_module(text)))
  return modules


# ---------------------------------------------------------------------------------------------------- the trace
def traced_ops(fn, updates: int, modules) -> tuple[list[tuple[str, float, float, str, str, str]], float]:
  """Runs `fn` `updates` times under `jax.profiler.trace`.

  Returns `([(class, seconds, FLOPs, module, op, description, component)] per op and update, wall seconds per
  update)`. Each
  executed program (one `run_id`) is matched to the dumped module of its name that holds all the ops it ran, since
  several modules can share a name (the learner's critic and actor steps are both `jit_step`).
  """
  trace_dir = tempfile.mkdtemp(prefix="profile_train_trace_")
  try:
    start = time.perf_counter()
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for _ in range(updates):
        fn()
    wall = (time.perf_counter() - start) / updates
    path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True))[-1]
    events = json.load(gzip.open(path))
  finally:
    shutil.rmtree(trace_dir, ignore_errors=True)
  events = events["traceEvents"] if isinstance(events, dict) else events
  runs = collections.defaultdict(list)  # (module name, run id) -> [(op, seconds)]
  for event in events:
    args = event.get("args", {})
    if event.get("ph") == "X" and "hlo_op" in args:
      runs[(args.get("hlo_module", "?"), args.get("run_id"))].append((args["hlo_op"], event["dur"] * 1e-6))
  totals = collections.defaultdict(lambda: [0.0, 0.0])  # (module index, op) -> [seconds, FLOPs]
  for (name, _), ran in runs.items():
    names = {op for op, _ in ran}
    candidates = [i for i, (module, ops) in enumerate(modules) if module == name]
    best = max(candidates, key=lambda i: len(names & modules[i][1].keys()), default=None)
    for op, seconds in ran:
      info = modules[best][1].get(op) if best is not None else None
      entry = totals[(best, op)]
      entry[0] += seconds / updates
      entry[1] += (info[1] if info else 0.0) / updates
  rows = []
  for (index, op), (seconds, flops) in totals.items():
    module, ops = modules[index] if index is not None else ("?", {})
    kind, _, description, component = ops.get(op, ("(not in the HLO dump)", 0.0, "", "?"))
    rows.append((kind, seconds, flops, f"{module}#{index}", op, description, component))
  return rows, wall


# ---------------------------------------------------------------------------------------------------- matmul ceiling
def best_seconds(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best


def training_matmul_shapes(tokens: int, batch: int, seq_len: int,
                           model: ModelConfig) -> list[tuple[str, tuple, tuple, int]]:
  """`(name, lhs shape, rhs shape, count per training step)` of the actor's forward and backward matmuls."""
  h, ff, v = model.hidden_size, model.intermediate_size, model.vocab_size
  q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
  layers = model.num_layers
  linears = [("q/o proj", h, q, 2 * layers), ("k/v proj", h, kv, 2 * layers), ("mlp gate/up", h, ff, 2 * layers),
             ("mlp down", ff, h, layers), ("lm head", h, v, 1)]
  shapes = []
  for name, a, b, count in linears:
    shapes += [(f"{name} fwd", (tokens, a), (a, b), count), (f"{name} dx", (tokens, b), (b, a), count),
               (f"{name} dW", (a, tokens), (tokens, b), count)]
  heads, d = batch * model.num_heads, model.head_dim
  # QKᵀ [t, d]·[d, s] and PV [t, s]·[s, d] per head; their backward products have the same three shapes.
  shapes += [("attn QK^T", (heads, seq_len, d), (heads, d, seq_len), 3 * layers),
             ("attn PV", (heads, seq_len, seq_len), (heads, seq_len, d), 3 * layers)]
  return shapes


def matmul_ceiling(shapes, peak_n: int, repeats: int):
  """Per-shape GFLOP/s, the FLOP-weighted rate of all shapes and the `[n, n]²` peak, timed back to back."""
  rng = jax.random.PRNGKey(0)
  matmul = jax.jit(jnp.matmul)
  peak_a = jax.random.normal(rng, (peak_n, peak_n), jnp.float32)
  peak = 2.0 * peak_n ** 3 / best_seconds(matmul, peak_a, peak_a, repeats=repeats)
  rows, total_flops, total_seconds = [], 0.0, 0.0
  for name, lhs, rhs, count in shapes:
    a = jax.random.normal(rng, lhs, jnp.float32)
    b = jax.random.normal(rng, rhs, jnp.float32)
    flops = 2.0 * float(np.prod(lhs)) * rhs[-1]
    seconds = best_seconds(matmul, a, b, repeats=repeats)
    rows.append((name, lhs, rhs, count, flops / seconds))
    total_flops += count * flops
    total_seconds += count * seconds
  return rows, total_flops / total_seconds, peak


def main(argv):
  del argv
  # Set before the CPU backend starts (nothing above has run a computation): the optimized HLO of every compiled
  # module, to class the traced ops.
  dump_dir = tempfile.mkdtemp(prefix="profile_train_hlo_")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump_dir} --xla_dump_hlo_as_text")
  try:
    _profile(dump_dir)
  finally:
    shutil.rmtree(dump_dir, ignore_errors=True)


def _profile(dump_dir: str):
  hidden = _HIDDEN.value
  model = ModelConfig.tiny("qwen3", vocab_size=_VOCAB.value, hidden_size=hidden, intermediate_size=3 * hidden,
                           num_layers=_LAYERS.value, num_heads=hidden // 64, num_kv_heads=max(hidden // 128, 1),
                           head_dim=64)
  config = config_lib.default_learner_config()
  config.sao.critic_warmup_steps = 0
  config.mesh.update(data=1, fsdp=1, tensor=1)
  config.batching.bucket_lengths = (_SEQ_LEN.value,)
  mesh = make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  learner = Learner(config, model, init_params(model, jax.random.PRNGKey(0)), mesh=mesh)
  rng = np.random.default_rng(0)
  learner.update(_trajectories(rng, _BATCH.value, _SEQ_LEN.value, _VOCAB.value))  # compile + warm up
  start = time.perf_counter()
  learner.update(_trajectories(rng, _BATCH.value, _SEQ_LEN.value, _VOCAB.value))
  untraced = time.perf_counter() - start
  rows, traced = traced_ops(
      lambda: learner.update(_trajectories(rng, _BATCH.value, _SEQ_LEN.value, _VOCAB.value)), _UPDATES.value,
      hlo_modules(dump_dir))

  by_class, by_component, component_matmul = collections.Counter(), collections.Counter(), collections.Counter()
  for kind, seconds, *_, component in rows:
    by_class[kind] += seconds
    by_component[component] += seconds
    component_matmul[component] += seconds if kind == "matmul" else 0.0
  total = sum(by_class.values())
  matmul_seconds = by_class["matmul"]
  matmul_flops = sum(flops for kind, _, flops, *_ in rows if kind == "matmul")
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores")
  print(f"model: qwen3 hidden={hidden} layers={_LAYERS.value} vocab={_VOCAB.value}; batch [{_BATCH.value}, "
        f"{_SEQ_LEN.value}]; update {untraced:.3f} s untraced, {traced:.3f} s traced (mean of {_UPDATES.value})")
  print(f"\nXLA op time per update, {total * 1e3:.1f} ms summed over ops (threads may overlap):")
  for kind, seconds in by_class.most_common():
    print(f"  {kind:<40} {seconds * 1e3:9.1f} ms  {100 * seconds / total:5.1f} %")
  print("by model part (JAX name scope of the op), and the part's matmul / other ops:")
  for component, seconds in by_component.most_common():
    matmul = component_matmul[component]
    print(f"  {component:<40} {seconds * 1e3:9.1f} ms  {100 * seconds / total:5.1f} %   "
          f"({100 * matmul / total:4.1f} % matmul, {100 * (seconds - matmul) / total:4.1f} % other)")
  if matmul_seconds > 0:
    print(f"  matmul ops: {matmul_flops / 1e9:.2f} GFLOP per update (from the HLO shapes), "
          f"{matmul_flops / matmul_seconds / 1e9:.2f} GFLOP/s inside them")
  print(f"\nslowest {_TOP.value} ops (ms per update, module#dump, op, class, shapes):")
  for kind, seconds, _, module, op, description, component in sorted(rows, key=lambda row: -row[1])[:_TOP.value]:
    print(f"  {seconds * 1e3:8.2f} ms  {module[:16]:<16} {op[:26]:<26} {kind[:12]:<12} {component[:12]:<12} "
          f"{description[:40]}")

  tokens = _BATCH.value * _SEQ_LEN.value
  shape_rows, weighted, peak = matmul_ceiling(
      training_matmul_shapes(tokens, _BATCH.value, _SEQ_LEN.value, model), _MATMUL.value, _REPEATS.value)
  print(f"\nmatmul shapes of one actor training step, timed alone (best of {_REPEATS.value}), vs the "
        f"{_MATMUL.value}³ float32 peak {peak / 1e9:.2f} GFLOP/s:")
  for name, lhs, rhs, count, rate in shape_rows:
    print(f"  {name:<16} {str(lhs):>18} @ {str(rhs):<18} x{count:<3} {rate / 1e9:8.2f} GFLOP/s  {rate / peak:5.2f}")
  print(f"FLOP-weighted rate of these shapes: {weighted / 1e9:.2f} GFLOP/s = {weighted / peak:.2f} of the peak "
        f"(the ceiling of bench_train.py's ratio if nothing but matmuls took time)")
  if matmul_seconds > 0:
    print(f"matmul share of the update's op time: {matmul_seconds / total:.2f}")
  counted = sum(6 * p * tokens for p in [_param_count(learner.actor_params)] +
                [_param_count(learner.critic_params)] * config.sao.critic_epochs)
  counted += 2 * 2 * _param_count(learner.critic_params) * tokens
  print(f"bench_train.py counts {counted / 1e9:.1f} GFLOP per update (6·P·tokens per step, 2·P·tokens per forward, "
        f"embeddings included); the HLO's matmuls do {matmul_flops / 1e9:.1f} GFLOP")
  print(f"bench_train.py's ratio from this update: {counted / untraced / peak:.3f}")


if __name__ == "__main__":
  define_flags()
  sys.exit(app.run(main))
