"""The client and the local engine against SGLang's own code (the pinned `sglang` wheel, see
`tests/engines/sglang_reference.py`): every request `SGLangEngine` sends is one SGLang's `/generate` contract check,
request dataclasses and `SamplingParams.verify` accept, on a route SGLang's HTTP server has; every answer of the local engine decodes with
SGLang's response types, with only the `meta_info` keys SGLang's server writes; bodies SGLang refuses, the local
engine refuses too. The client and engine talk over loopback HTTP (the real aiohttp app around an in-process
`LocalEngine` with its real sampler on a tiny random model); a middleware records each exchange.

Also: the recorded bodies in `tests/engines/fixtures/` (written from SGLang's docs, and the ones recorded from a
running sglang-jax server, `fixtures/sglang_jax/`) decode with SGLang's response types and parse with the client.
"""
from __future__ import annotations

import asyncio
import dataclasses
import glob
import json
import math
import os
import subprocess
from typing import Any

import pytest
from aiohttp import web

from sao.engines.http_app import build_app
from sao.engines.local_engine import EngineConfig, LocalEngine
from sao.engines.request_checks import KNOWN_SAMPLING_KEYS
from sao.engines.sglang_client import EngineError, SGLangEngine, parse_generate_response
from sao.models.sampling import SamplingParams
from sao.models.tokenizer import toy_tokenizer
from tests.engines import sglang_reference
from tests.engines.helpers import save_tiny_model

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
VOCAB_SIZE = toy_tokenizer().vocab_size  # the tiny model's (`save_tiny_model`)
# What the local engine answers beyond SGLang's fields (the client never reads them): its own diagnostics in
# /get_model_info, and the version it now serves in /update_weights_from_disk's answer.
LOCAL_MODEL_INFO_EXTRAS = {"engine", "vocab_size", "context_length", "max_batch_size", "batch_window_ms", "stats"}
LOCAL_UPDATE_EXTRAS = {"weight_version"}
# Bodies SGLang's /generate refuses (its contract check answers 400); the local engine must refuse them too.
REFUSED_BODIES = [
    {"input_ids": [1, 2], "sampling_params": {"max_new_token": 3}},  # a misspelt key
    {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3.5}},
    {"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}},
    {"input_ids": [1, "2"], "sampling_params": {"max_new_tokens": 3}},
    {"input_ids": [1, 2], "sampling_params": {"stop_token_ids": 7}},
    {"input_ids": [1, 2], "stream": "no"},
    {"input_ids": [1, 2], "return_logprob": "yes"},
    {"input_ids": [[1, 2], [3]], "return_logprob": [True, 1]},
]
# Well-typed values SGLang's `SamplingParams.verify` refuses (a 400 too); the local engine must refuse them.
REFUSED_SAMPLING = [{"top_p": 0.0}, {"top_p": 1.5}, {"temperature": -1.0}, {"max_new_tokens": -1}, {"min_p": 2.0},
                    {"top_k": -2}]


@pytest.fixture(scope="module")
def ref() -> sglang_reference.SGLangReference:
  return sglang_reference.load_reference()  # fails (never skips) when the pinned wheel cannot be had


@dataclasses.dataclass
class Exchange:
  method: str
  path: str
  request: Any  # the JSON body (None: none)
  status: int
  response: Any  # the JSON body, or the text when it is not JSON


def _refused(body: Any) -> bool:
  return body in REFUSED_BODIES or (isinstance(body, dict) and body.get("sampling_params") in REFUSED_SAMPLING)


def _decode(text: str) -> Any:
  try:
    return json.loads(text) if text else None
  except json.JSONDecodeError:
    return text


async def _client_session(model_dir: str, new_dir: str) -> tuple[list[Exchange], dict[str, Any]]:
  """Every client call the project makes, against the local engine; returns the exchanges and what the client
  returned."""
  engine = LocalEngine(model_dir, EngineConfig(batch_window_ms=0, max_batch_size=2, prompt_buckets=(16,),
                                               batch_buckets=(2,), new_token_buckets=(8,), prefix_cache_bytes=0))
  exchanges: list[Exchange] = []

  @web.middleware
  async def record(request: web.Request, handler):
    raw = await request.read()
    resp = await handler(request)
    exchanges.append(Exchange(request.method, request.path, _decode(raw.decode()), resp.status,
                              _decode(resp.text or "")))
    return resp

  app = build_app(engine)
  app.middlewares.insert(0, record)
  runner = web.AppRunner(app, access_log=None)
  await runner.setup()
  await web.TCPSite(runner, "127.0.0.1", 0).start()
  host, port = runner.addresses[0][:2]
  got: dict[str, Any] = {}
  try:
    async with SGLangEngine(f"http://{host}:{port}", timeout_s=120, max_retries=0) as client:
      got["health"] = await client.health()
      got["info"] = await client.get_model_info()
      greedy = await client.generate([3, 4, 5], SamplingParams(max_new_tokens=4, temperature=0.0))
      got["greedy"] = greedy
      got["stopped"] = await client.generate([3, 4, 5], SamplingParams(max_new_tokens=4, temperature=0.0,
                                                                       stop_token_ids=(greedy.token_ids[0],)))
      got["mapping"] = await client.generate([6, 7], {"max_new_tokens": 3, "temperature": 0.7, "top_k": 5,
                                                      "top_p": 0.9, "ignore_eos": True})
      got["batch"] = await client.generate_batch([[3, 4], [5, 6, 7]], [SamplingParams(max_new_tokens=2),
                                                                      SamplingParams(max_new_tokens=3, top_k=4)])
      try:
        await client.update_weights_from_disk(os.path.join(new_dir, "missing"), weight_version=8)
        got["update_refused"] = None
      except EngineError as e:
        got["update_refused"] = e
      got["update"] = await client.update_weights_from_disk(new_dir, weight_version=7)
      got["after"] = await client.generate([3, 4, 5], SamplingParams(max_new_tokens=2, temperature=0.0))
      got["info_after"] = await client.get_model_info()
      await client.flush_cache()
      got["refused"] = []
      for body in REFUSED_BODIES + [{"input_ids": [1, 2], "sampling_params": sp} for sp in REFUSED_SAMPLING]:
        try:
          await client.request("POST", "/generate", body)
          got["refused"].append(None)
        except EngineError as e:
          got["refused"].append(e.status)
  finally:
    await runner.cleanup()
  return exchanges, got


@pytest.fixture(scope="module")
def session(tmp_path_factory):
  root = tmp_path_factory.mktemp("sglang_contract")
  model_dir = save_tiny_model(str(root / "model"), seed=0, scale=3.0)
  new_dir = save_tiny_model(str(root / "model_v7"), seed=1, scale=3.0)
  return asyncio.run(_client_session(model_dir, new_dir))


def test_reference_is_the_pinned_wheel_and_refuses_what_sglang_refuses(ref):
  """The reference is live (so the checks below can fail): SGLang's contract refuses a misspelt sampling key and
  accepts the documented batch form; its io_struct and routes have the fields and paths the docs name."""
  assert "max_new_token" in ref.generate_contract_error({"input_ids": [1], "sampling_params": {"max_new_token": 1}})
  assert ref.generate_contract_error({"input_ids": [[1, 2], [3]], "return_logprob": True,
                                      "sampling_params": [{"max_new_tokens": 2}, {"top_k": -1}]}) is None
  assert {"input_ids", "sampling_params", "return_logprob"} <= set(ref.generate_req_input)
  assert ref.update_weights_req_input["model_path"].required
  assert {("POST", "/generate"), ("GET", "/health")} <= ref.routes
  assert {"output_token_logprobs", "weight_version", "finish_reason"} <= ref.meta_info_keys


def test_a_wheel_that_cannot_be_had_is_an_error_not_a_skip(tmp_path, monkeypatch):
  """No package index reachable and an empty cache: `SGLangReferenceError` naming the pip command and where to put
  the file (a contract test that skipped here would pass CI without checking anything)."""
  monkeypatch.setenv("SAO_SGLANG_WHEEL_DIR", str(tmp_path))
  for name, value in (("PIP_NO_INDEX", "1"), ("PIP_FIND_LINKS", ""), ("PIP_EXTRA_INDEX_URL", "")):
    monkeypatch.setenv(name, value)
  with pytest.raises(sglang_reference.SGLangReferenceError,
                     match=f"(?s)pip download sglang==.*Put that file in {tmp_path}"):
    sglang_reference.fetch_wheel()

  # A download that brings another file (a different build under the same name) is refused by its hash.
  def fake_pip(cmd, **kwargs):
    (tmp_path / sglang_reference.SGLANG_WHEEL).write_bytes(b"not the pinned wheel")
    return subprocess.CompletedProcess(cmd, 0, "", "")

  monkeypatch.setattr(sglang_reference.subprocess, "run", fake_pip)
  with pytest.raises(sglang_reference.SGLangReferenceError, match="sha256 .*, expected " +
                     sglang_reference.SGLANG_WHEEL_SHA256):
    sglang_reference.fetch_wheel()


def test_client_requests_are_what_sglang_accepts(ref, session):
  exchanges, _ = session
  assert {(x.method, x.path) for x in exchanges} == {
      ("GET", "/health"), ("GET", "/get_model_info"), ("POST", "/generate"), ("POST", "/update_weights_from_disk"),
      ("POST", "/flush_cache")}
  client_calls = [x for x in exchanges if not _refused(x.request)]
  for x in client_calls:
    assert (x.method, x.path) in ref.routes, f"{x.method} {x.path}: not a route of SGLang's server"
    if x.path == "/generate":
      assert ref.generate_contract_error(x.request) is None, x.request
      fields = ref.generate_req_input
      sampling = x.request["sampling_params"]
      for sp in sampling if isinstance(sampling, list) else [sampling]:
        assert set(sp) <= set(ref.api.SamplingParams.__struct_fields__), sp
        assert ref.sampling_params_error(sp, VOCAB_SIZE) is None, sp
    elif x.path == "/update_weights_from_disk":
      fields = ref.update_weights_req_input
      assert {k for k, f in fields.items() if f.required} <= set(x.request)
    else:
      assert x.request is None, f"{x.path}: SGLang takes no body here"
      continue
    for key, value in x.request.items():
      assert key in fields, f"{x.path}: SGLang has no request field {key!r} (it would be ignored)"
      assert sglang_reference.matches(value, fields[key].annotation), (x.path, key, value, fields[key])
  update = [x for x in exchanges if x.path == "/update_weights_from_disk"][-1]
  assert update.request["weight_version"] == "7" and update.request["flush_cache"] is True


def _check_generate_item(ref, item: Any) -> None:
  api = ref.api
  decoded = api.GenerateResponse.from_json_value(item)  # raises JsonContractError on a wrong type
  assert set(item) <= set(api.GenerateResponse.__struct_fields__), set(item)
  meta = item["meta_info"]
  assert set(meta) <= ref.meta_info_keys, f"meta_info keys SGLang never writes: {set(meta) - ref.meta_info_keys}"
  finish = decoded.meta_info.finish_reason
  assert isinstance(finish, (api.FinishStop, api.FinishLength)), finish  # a malformed one decodes to a plain dict
  entries = decoded.meta_info.output_token_logprobs
  assert entries is not None and len(entries) == meta["completion_tokens"] == len(item["output_ids"])
  assert [e.token_id for e in entries] == item["output_ids"]
  assert all(e.logprob is not None and math.isfinite(e.logprob) and e.logprob <= 0 for e in entries)
  if isinstance(finish, api.FinishStop):
    assert finish.matched == item["output_ids"][-1]  # SGLang keeps the matched stop token in output_ids
  else:
    assert finish.length == len(item["output_ids"])
  assert isinstance(decoded.meta_info.weight_version, str)


def test_local_engine_answers_what_sglang_answers(ref, session):
  exchanges, got = session
  for x in exchanges:
    if x.path == "/generate" and not _refused(x.request):
      assert x.status == 200, x
      for item in x.response if isinstance(x.response, list) else [x.response]:
        _check_generate_item(ref, item)
    elif x.path == "/update_weights_from_disk":  # SGLang: 200 with success true, else 400 with success false
      assert x.status == (200 if x.response["success"] else 400), x
      fields = ref.update_weights_req_output
      assert set(x.response) <= set(fields) | LOCAL_UPDATE_EXTRAS
      assert {k for k, f in fields.items() if f.required} <= set(x.response)
      assert all(sglang_reference.matches(v, fields[k].annotation) for k, v in x.response.items() if k in fields)
    elif x.path == "/get_model_info":
      info = ref.api.GetModelInfoResponse.from_json_value(x.response)
      assert set(x.response) - set(ref.api.GetModelInfoResponse.__struct_fields__) <= LOCAL_MODEL_INFO_EXTRAS
      assert info.is_generation and info.model_path
    elif x.path in ("/health", "/flush_cache"):
      assert x.status == 200
  # What the client made of those answers.
  assert got["health"] and got["stopped"].finish_reason == "stop"
  assert got["update_refused"].status == 400 and "missing" in got["update_refused"].message
  assert got["stopped"].token_ids == got["greedy"].token_ids[:1]
  assert [r.finish_reason for r in got["batch"]] == ["length", "length"]
  assert got["greedy"].weight_version == "0" and got["after"].weight_version == "7"
  assert got["info"]["weight_version"] == "0" and got["info_after"]["weight_version"] == "7"
  assert got["info"]["vocab_size"] == VOCAB_SIZE  # the vocabulary the sampling checks above used


def test_model_info_without_a_tokenizer_decodes_with_sglang_types(ref, tmp_path):
  """A model directory without tokenizer files (the engine then serves ids only, as SGLang with
  `--skip-tokenizer-init`): `tokenizer_path` is still a string, as SGLang reports it (its default is the model path);
  SGLang's type has no null there."""
  model_dir = save_tiny_model(str(tmp_path / "model"))
  os.remove(os.path.join(model_dir, "tokenizer.json"))
  engine = LocalEngine(model_dir, EngineConfig(prompt_buckets=(16,), batch_buckets=(2,), max_batch_size=2,
                                               new_token_buckets=(8,), prefix_cache_bytes=0))
  assert engine.tokenizer is None
  info = ref.api.GetModelInfoResponse.from_json_value(json.loads(json.dumps(engine.model_info())))
  assert info.tokenizer_path == model_dir


def test_local_engine_refuses_what_sglang_refuses(ref, session):
  exchanges, got = session
  assert len(got["refused"]) == len(REFUSED_BODIES) + len(REFUSED_SAMPLING)
  for body, status in zip(REFUSED_BODIES, got["refused"]):
    assert ref.generate_contract_error(body) is not None, f"SGLang accepts {body}: not a refusal test"
    assert status == 400, f"the local engine answered {status} to {body}, which SGLang refuses with 400"
  for sp, status in zip(REFUSED_SAMPLING, got["refused"][len(REFUSED_BODIES):]):
    assert ref.generate_contract_error({"input_ids": [1], "sampling_params": sp}) is None  # well-typed
    assert ref.sampling_params_error(sp, VOCAB_SIZE) is not None, f"SGLang accepts {sp}: not a refusal test"
    assert status == 400, f"the local engine answered {status} to {sp}, which SGLang refuses with 400"
  # The error body is SGLang's `{"error": {"message", "code"?}}` (its `_create_error_response`, `ErrorBody`).
  for x in exchanges:
    if _refused(x.request):
      assert ref.api.GenerateStreamError.from_json_value(x.response).error.message, x.response


def test_local_engine_routes_are_sglang_routes(ref, tmp_path):
  app = build_app(LocalEngine(save_tiny_model(str(tmp_path / "model")), EngineConfig(
      prompt_buckets=(16,), batch_buckets=(2,), max_batch_size=2, new_token_buckets=(8,), prefix_cache_bytes=0)))
  served = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
  assert served and served <= ref.routes, served - ref.routes


def test_local_engine_sampling_keys_are_sglang_keys(ref):
  assert KNOWN_SAMPLING_KEYS <= set(ref.api.SamplingParams.__struct_fields__)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(FIXTURES, "generate_*.json")) +
                                        glob.glob(os.path.join(FIXTURES, "sglang_jax", "generate_*.json"))),
                         ids=os.path.basename)
def test_recorded_generate_bodies_decode_with_sglang_types(ref, path):
  with open(path) as f:
    body = json.load(f)
  items = body if isinstance(body, list) else [body]
  for item in items:
    decoded = ref.api.GenerateResponse.from_json_value(item)
    finish = decoded.meta_info.finish_reason
    assert not isinstance(finish, dict), finish
    if isinstance(finish, ref.api.FinishStop) and isinstance(finish.matched, int):
      assert item["output_ids"][-1] == finish.matched  # the matched stop id is kept, as the local engine keeps it
  parsed = parse_generate_response(body)
  for item, result in zip(items, parsed if isinstance(parsed, list) else [parsed]):
    assert list(result.token_ids) == [e[1] for e in item["meta_info"]["output_token_logprobs"]]
