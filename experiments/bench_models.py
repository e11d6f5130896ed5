r"""Benchmark: decode throughput of the KV-cache sampler (`sao.models.sampling`) vs `transformers` `generate`.

    python experiments/bench_models.py                          # batch 1 and 32, greedy, 32-token prompts
    python experiments/bench_models.py --batch_sizes=1,8 --new_tokens=32 --repeats=2

Both run on CPU, in this one process, on the same small random Qwen3 weights: ours are exported with
`sao.models.hf.save_pretrained` and loaded by `transformers.AutoModelForCausalLM`. Greedy, no stop tokens, every row
generates exactly `new_tokens` tokens; tokens/s = batch · new_tokens / wall time (prefill included, compile excluded:
one warm-up call first). Prints one table and the ratio ours / transformers, plus the fraction of greedy tokens on
which the two implementations agree (a sanity check that the export is the same model).
"""
import tempfile
import time

from absl import app, flags
import jax
import numpy as np
import torch
import transformers

from sao.models import hf as hf_io
from sao.models.config import ModelConfig
from sao.models.sampling import Sampler, SamplingParams
from sao.models.transformer import init_params

_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "32"], "Batch sizes to time.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Prompt length (tokens).")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 64, "Generated tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repetitions (median reported).")
_HIDDEN = flags.DEFINE_integer("hidden", 256, "Hidden size.")
_LAYERS = flags.DEFINE_integer("layers", 4, "Decoder layers.")
_VOCAB = flags.DEFINE_integer("vocab", 8192, "Vocabulary size.")


def _median_time(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - start)
  return float(np.median(times)), out


def main(argv):
  del argv
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


if __name__ == "__main__":
  app.run(main)
