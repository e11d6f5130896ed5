r"""Benchmarks of the model layer on CPU, against `transformers` on the same weights.

    python experiments/bench/bench_models.py                          # both benchmarks below
    python experiments/bench/bench_models.py --benchmarks=decode --batch_sizes=1,8 --new_tokens=32 --repeats=2
    python experiments/bench/bench_models.py --benchmarks=hybrid_prefill --hybrid_lengths=512,2048

`decode`: decode throughput of the KV-cache sampler (`sao.models.sampling`) vs `transformers` `generate`.
`hybrid_prefill`: prefill tokens/s of a Qwen3.5-style hybrid backbone (`qwen3_5_text`: 3 Gated DeltaNet layers per
full-attention layer) at T = 512, 2048, 8192, batch 1: our chunked Gated DeltaNet form, our recurrent form (a
`lax.scan` over tokens), and transformers' pure-torch chunked fallback (`torch_chunk_gated_delta_rule`). Tokens/s =
T / wall time of one backbone forward (final hidden states, compile excluded), median of `repeats`; the max
|hidden| difference to transformers is printed as a sanity check.

Decode details:
Both run on CPU, in this one process, on the same small random Qwen3 weights: ours are exported with
`sao.models.hf.save_pretrained` and loaded by `transformers.AutoModelForCausalLM`. Greedy, no stop tokens, every row
generates exactly `new_tokens` tokens; tokens/s = batch · new_tokens / wall time (prefill included, compile excluded:
one warm-up call first). Prints one table and the ratio ours / transformers, plus the fraction of greedy tokens on
which the two implementations agree (a sanity check that the export is the same model).
"""
import os
import sys
import tempfile
import time

from absl import app, flags
import jax
import numpy as np
import torch
import transformers

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sao.models import hf as hf_io
from sao.models.config import ModelConfig
from sao.models.sampling import Sampler, SamplingParams
from sao.models.transformer import CausalLM, init_params


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _BATCH_SIZES, _PROMPT_LEN, _NEW_TOKENS, _REPEATS, _HIDDEN, _LAYERS  # pylint: disable=global-statement
  global _VOCAB, _BENCHMARKS, _HYBRID_LENGTHS  # pylint: disable=global-statement
  _BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "32"], "Batch sizes to time.")
  _PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Prompt length (tokens).")
  _NEW_TOKENS = flags.DEFINE_integer("new_tokens", 64, "Generated tokens per row.")
  _REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repetitions (median reported).")
  _HIDDEN = flags.DEFINE_integer("hidden", 256, "Hidden size.")
  _LAYERS = flags.DEFINE_integer("layers", 4, "Decoder layers.")
  _VOCAB = flags.DEFINE_integer("vocab", 8192, "Vocabulary size.")
  _BENCHMARKS = flags.DEFINE_list("benchmarks", ["decode", "hybrid_prefill"], "Which benchmarks to run.")
  _HYBRID_LENGTHS = flags.DEFINE_list("hybrid_lengths", ["512", "2048", "8192"], "Prefill lengths (hybrid_prefill).")


def _median_time(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - start)
  return float(np.median(times)), out


def bench_decode():
  config = ModelConfig(model_type="qwen3", vocab_size=_VOCAB.value, hidden_size=_HIDDEN.value,
                       intermediate_size=3 * _HIDDEN.value, num_layers=_LAYERS.value, num_heads=4, num_kv_heads=2,
                       head_dim=_HIDDEN.value // 4, qk_norm=True, rope_theta=1e6)
  params = init_params(config, jax.random.PRNGKey(0))
  # Larger-than-default weights so greedy argmaxes are well separated (the agreement check is then meaningful).
  params = jax.tree.map(lambda x: x * 3.0 if x.ndim > 1 else x, params)
  directory = tempfile.mkdtemp(prefix="bench_models_")
  hf_io.save_pretrained(config, params, directory)
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
  sampler = Sampler(config, params)
  n_new, repeats = _NEW_TOKENS.value, _REPEATS.value
  rng = np.random.default_rng(0)
  print(f"qwen3 hidden={config.hidden_size} layers={config.num_layers} vocab={config.vocab_size} "
        f"prompt={_PROMPT_LEN.value} new_tokens={n_new} torch_threads={torch.get_num_threads()} "
        f"jax={jax.devices()[0].platform}")
  rows = []
  for batch in (int(b) for b in _BATCH_SIZES.value):
    prompts = rng.integers(0, config.vocab_size, (batch, _PROMPT_LEN.value))
    sp = SamplingParams(max_new_tokens=n_new, temperature=0.0)
    sampler.generate(list(prompts), sp)  # compile
    t_ours, ours = _median_time(lambda: sampler.generate(list(prompts), sp), repeats)

    ids = torch.tensor(prompts, dtype=torch.long)
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                  pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
      torch_model.generate(ids, **kwargs)  # warm-up
      t_hf, hf_out = _median_time(lambda: torch_model.generate(ids, **kwargs), repeats)
    hf_tokens = hf_out[:, _PROMPT_LEN.value:].numpy()
    agree = float(np.mean(np.stack([c.token_ids for c in ours]) == hf_tokens))
    rows.append((batch, batch * n_new / t_ours, batch * n_new / t_hf, agree))

  print(f"{'batch':>5} | {'sao tok/s':>10} | {'hf tok/s':>10} | {'sao/hf':>6} | greedy agreement")
  for batch, ours_tps, hf_tps, agree in rows:
    print(f"{batch:>5} | {ours_tps:>10.1f} | {hf_tps:>10.1f} | {ours_tps / hf_tps:>6.2f} | {agree:.3f}")


def bench_hybrid_prefill():
  hidden = _HIDDEN.value
  config = ModelConfig(
      model_type="qwen3_5_text", vocab_size=_VOCAB.value, hidden_size=hidden, intermediate_size=3 * hidden,
      num_layers=_LAYERS.value, num_heads=4, num_kv_heads=2, head_dim=64, qk_norm=True, rope_theta=1e7,
      attn_output_gate=True, partial_rotary_factor=0.25, zero_centered_norm=True,
      layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(_LAYERS.value)),
      linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
      linear_chunk_size=64)
  params = init_params(config, jax.random.PRNGKey(0))
  directory = tempfile.mkdtemp(prefix="bench_hybrid_")
  hf_io.save_pretrained(config, params, directory)
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
  forms = {form: jax.jit(lambda p, ids, c=config.replace(linear_attn_form=form): CausalLM(c).apply(
      {"params": p}, ids, method=CausalLM.hidden)[0]) for form in ("chunked", "recurrent")}
  repeats = _REPEATS.value
  print(f"qwen3_5_text hidden={hidden} layers={config.num_layers} ({config.layer_types.count('linear_attention')} "
        f"Gated DeltaNet: {config.linear_num_key_heads} q/k heads x {config.linear_key_head_dim}, "
        f"{config.linear_num_value_heads} v heads x {config.linear_value_head_dim}, chunk {config.linear_chunk_size}) "
        f"batch=1 torch_threads={torch.get_num_threads()} jax={jax.devices()[0].platform}")
  print(f"{'T':>6} | {'chunked tok/s':>13} | {'recurrent tok/s':>15} | {'hf torch tok/s':>14} | "
        f"{'chunked/hf':>10} | max |Δ hidden| vs hf")
  rng = np.random.default_rng(0)
  for t in (int(x) for x in _HYBRID_LENGTHS.value):
    ids = rng.integers(0, config.vocab_size, (1, t)).astype(np.int32)
    tps, outs = {}, {}
    for form, fn in forms.items():
      jax.block_until_ready(fn(params, ids))  # compile
      elapsed, out = _median_time(lambda: jax.block_until_ready(fn(params, ids)), repeats)
      tps[form], outs[form] = t / elapsed, np.asarray(out)
    with torch.no_grad():
      run_hf = lambda: torch_model.model(input_ids=torch.tensor(ids, dtype=torch.long)).last_hidden_state
      run_hf()  # warm-up
      elapsed, hf_out = _median_time(run_hf, repeats)
    diff = max(float(np.abs(outs[f] - hf_out.numpy()).max()) for f in outs)
    print(f"{t:>6} | {tps['chunked']:>13.1f} | {tps['recurrent']:>15.1f} | {t / elapsed:>14.1f} | "
          f"{tps['chunked'] * elapsed / t:>10.2f} | {diff:.1e}")


def main(argv):
  del argv
  for name in _BENCHMARKS.value:
    {"decode": bench_decode, "hybrid_prefill": bench_hybrid_prefill}[name]()


if __name__ == "__main__":
  define_flags()
  app.run(main)
