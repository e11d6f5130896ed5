"""Parity with HF transformers (torch CPU) on tiny random configs, float32, with padding; export round trip."""
import jax
import numpy as np
import pytest
import torch
import transformers

from sao.models import hf as hf_io
from sao.models.transformer import Critic, init_critic_from_policy
from tests.models.helpers import MODEL_TYPES, forward, hf_positions, padded_batch, random_torch_model, tiny_hf_config

TOL = 1e-4


def _torch_outputs(model, ids, mask):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(hf_positions(mask)), output_hidden_states=True)
  return out.logits.numpy(), out.hidden_states[-1].numpy()


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_logits_match_hf_with_padding(model_type, tmp_path):
  overrides = {"tie_word_embeddings": True} if model_type == "llama" else {}
  if model_type == "qwen3_moe":
    overrides = {"decoder_sparse_step": 1, "mlp_only_layers": (1,), "norm_topk_prob": True}
  torch_model = random_torch_model(tiny_hf_config(model_type, **overrides))
  torch_model.save_pretrained(tmp_path)
  config, params = hf_io.load_pretrained(str(tmp_path))
  assert config.model_type == model_type
  rng = np.random.default_rng(0)
  ids, mask = padded_batch(rng, config.vocab_size, [9, 5, 1], 9, left=True)
  want_logits, want_hidden = _torch_outputs(torch_model, ids, mask)
  logits = forward(config, params, ids, mask)
  real = mask.astype(bool)
  assert np.abs(logits[real] - want_logits[real]).max() <= TOL

  if model_type != "qwen3":
    return
  # The critic's backbone = the policy's backbone: its hidden states match HF's last hidden state.
  critic_params = init_critic_from_policy(params, rng=jax.random.PRNGKey(1))
  hidden, values = jax.jit(lambda cp, i, m: (
      Critic(config).apply({"params": cp}, i, m, method=Critic.hidden)[0],
      Critic(config).apply({"params": cp}, i, m)))(critic_params, ids, mask)
  assert np.abs(np.asarray(hidden)[real] - want_hidden[real]).max() <= TOL
  assert values.shape == ids.shape and values.dtype == np.float32
  head = critic_params["value_head"]
  want_values = want_hidden @ np.asarray(head["kernel"]).reshape(-1) + np.asarray(head["bias"])[0]  # kernel [1, E]
  np.testing.assert_allclose(np.asarray(values)[real], want_values[real], atol=1e-6)


def test_right_padding_matches_hf(tmp_path):
  torch_model = random_torch_model(tiny_hf_config("qwen3"), seed=3)
  torch_model.save_pretrained(tmp_path)
  config, params = hf_io.load_pretrained(str(tmp_path))
  ids, mask = padded_batch(np.random.default_rng(1), config.vocab_size, [7, 3], 7, left=False)
  want, _ = _torch_outputs(torch_model, ids, mask)
  logits = forward(config, params, ids, mask)
  real = mask.astype(bool)
  assert np.abs(logits[real] - want[real]).max() <= TOL


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3_moe"])
def test_export_loads_in_transformers(model_type, tmp_path):
  torch_model = random_torch_model(tiny_hf_config(model_type), seed=1)
  torch_model.save_pretrained(tmp_path / "src")
  config, params = hf_io.load_pretrained(str(tmp_path / "src"))
  # A tiny shard limit forces the sharded layout with an index file.
  hf_io.save_pretrained(config, params, str(tmp_path / "out"), max_shard_bytes=64 * 1024)
  assert (tmp_path / "out" / "model.safetensors.index.json").exists()
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32).eval()
  ids, mask = padded_batch(np.random.default_rng(2), config.vocab_size, [6, 4], 6)
  want, _ = _torch_outputs(torch_model, ids, mask)
  got, _ = _torch_outputs(reloaded, ids, mask)
  ours = forward(config, params, ids, mask)
  real = mask.astype(bool)
  assert np.abs(got[real] - want[real]).max() <= TOL
  assert np.abs(np.asarray(ours)[real] - got[real]).max() <= TOL
  config2, params2 = hf_io.load_pretrained(str(tmp_path / "out"))
  assert config2 == config
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
