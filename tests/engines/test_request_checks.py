"""Per-request validation of `/generate` rows: every field is range-checked before a row may join a batch."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sao.engines.request_checks import RequestError, RowLimits, check_generate_body, check_row

LIMITS = RowLimits(vocab_size=300, context_length=64, max_new_tokens_cap=16, max_stop_ids=4, eos_ids=(2,))

# (sampling_params or input_ids override, the field the 400 must name). Values from the bug report included.
BAD_PARAMS = [
    ({"top_k": 2**40}, "sampling_params.top_k"),
    ({"top_k": -2}, "sampling_params.top_k"),
    ({"top_k": 3.0}, "sampling_params.top_k"),
    ({"stop_token_ids": [2**40]}, "sampling_params.stop_token_ids"),
    ({"stop_token_ids": [300]}, "sampling_params.stop_token_ids"),
    ({"stop_token_ids": [-1]}, "sampling_params.stop_token_ids"),
    ({"stop_token_ids": ["5"]}, "sampling_params.stop_token_ids"),
    ({"stop_token_ids": 5}, "sampling_params.stop_token_ids"),
    ({"stop_token_ids": [3, 4, 5, 6]}, "sampling_params.stop_token_ids"),  # + eos = 5 > 4
    ({"max_new_tokens": json.loads("1e400")}, "sampling_params.max_new_tokens"),  # inf
    ({"max_new_tokens": 2**40}, "sampling_params.max_new_tokens"),
    ({"max_new_tokens": 0}, "sampling_params.max_new_tokens"),
    ({"max_new_tokens": 8.0}, "sampling_params.max_new_tokens"),
    ({"max_new_tokens": True}, "sampling_params.max_new_tokens"),
    ({"max_new_tokens": "8"}, "sampling_params.max_new_tokens"),
    ({"temperature": float("nan")}, "sampling_params.temperature"),
    ({"temperature": float("inf")}, "sampling_params.temperature"),
    ({"temperature": -0.5}, "sampling_params.temperature"),
    ({"temperature": 1e-30}, "sampling_params.temperature"),
    ({"temperature": 10**400}, "sampling_params.temperature"),
    ({"temperature": "hot"}, "sampling_params.temperature"),
    ({"temperature": None}, "sampling_params.temperature"),
    ({"top_p": 0.0}, "sampling_params.top_p"),
    ({"top_p": 1.5}, "sampling_params.top_p"),
    ({"top_p": float("nan")}, "sampling_params.top_p"),
    ({"ignore_eos": "yes"}, "sampling_params.ignore_eos"),
    ({"n": 2}, "sampling_params.n"),
    ({"min_p": 0.1}, "sampling_params.min_p"),
    ({"stop": ["</s>"]}, "sampling_params.stop"),
    ({"frequency_penalty": 1.0}, "sampling_params: unsupported keys"),
]


@pytest.mark.parametrize("params,field", BAD_PARAMS, ids=[f"{f}={p}"[:60] for p, f in BAD_PARAMS])
def test_each_bad_sampling_field_is_refused_naming_it(params, field):
  with pytest.raises(RequestError, match=f"^{field.replace('.', '[.]')}"):
    check_row("input_ids", [1, 2, 3], params, LIMITS)


@pytest.mark.parametrize("ids,message", [
    ([1, 2**70], r"input_ids: token id 1180591620717411303424 at position 1 is out of range \[0, 300\)"),
    ([1, 300], r"input_ids: token id 300 at position 1 is out of range"),
    ([1, -3], r"input_ids: token id -3 at position 1 is out of range"),
    ([1, 2.0], r"input_ids: token id 2.0 at position 1 is not an integer"),
    ([True], r"input_ids: token id True at position 0 is not an integer"),
    ([], r"input_ids: expected a non-empty list"),
    ("1 2 3", r"input_ids: expected a non-empty list"),
    ([1] * 64, r"input_ids: prompt of 64 tokens does not fit the context length 64"),
])
def test_bad_input_ids_are_refused_naming_the_position(ids, message):
  with pytest.raises(RequestError, match=message):
    check_row("input_ids", ids, {}, LIMITS)


def test_valid_row_is_clamped_to_what_the_sampler_can_hold():
  prompt, sp = check_row("input_ids", [1] * 60, {"max_new_tokens": 2**31 - 1, "top_k": 10**6, "temperature": 0,
                                                 "stop_token_ids": [7]}, LIMITS)
  assert prompt.dtype == np.int32 and prompt.tolist() == [1] * 60
  assert sp.max_new_tokens == 4  # context 64 − prompt 60
  assert sp.top_k == 300 and sp.temperature == 0.0 and sp.stop_token_ids == (7, 2)
  _, sp = check_row("input_ids", [1], {"top_k": -1, "ignore_eos": True, "max_new_tokens": 100}, LIMITS)
  assert sp.top_k == 0 and sp.stop_token_ids == () and sp.max_new_tokens == 16  # the new-token bucket cap


def test_generate_body_forms():
  batched, rows, _ = check_generate_body({"input_ids": [[1, 2], [3]], "sampling_params": [{}, {"top_k": 5}]}, LIMITS)
  assert batched and [r[0].tolist() for r in rows] == [[1, 2], [3]] and rows[1][1].top_k == 5
  with pytest.raises(RequestError, match=r"input_ids\[1\]: token id 999"):
    check_generate_body({"input_ids": [[1], [999]]}, LIMITS)
  with pytest.raises(RequestError, match=r"sampling_params: a list needs one entry per prompt \(2\)"):
    check_generate_body({"input_ids": [[1], [2]], "sampling_params": [{}]}, LIMITS)
  with pytest.raises(RequestError, match=r"sampling_params: expected an object, got str"):
    check_generate_body({"input_ids": [1], "sampling_params": "x"}, LIMITS)
  with pytest.raises(RequestError, match=r"^stream: "):
    check_generate_body({"input_ids": [1], "stream": True}, LIMITS)
  with pytest.raises(RequestError, match=r"request body must be a JSON object"):
    check_generate_body([1, 2], LIMITS)
