"""`sao.train.micro_batching`: rows per micro-batch by padded length, what B pads to, and the config's errors."""
import pytest

from sao.train import config as config_lib
from sao.train import micro_batching, steps


def test_rows_by_padded_length():
  mbs = micro_batching.parse(8, "8192:64, 32768:16")
  assert [mbs.rows(t) for t in (512, 8192, 16384, 32768, 131072)] == [64, 64, 16, 16, 8]
  assert mbs.batch_multiple(8) == 64
  assert micro_batching.parse(0, "").rows(4096) == 0 and micro_batching.parse(0, "").batch_multiple(8) == 8
  assert micro_batching.parse(0, "128:6").batch_multiple(4) == 12  # lcm(6, the shards for the whole-batch default)
  # The steps split a [B, T] batch by its own length's rows.
  assert steps.num_micro_batches((128, 8192), mbs) == 2
  assert steps.num_micro_batches((128, 131072), mbs) == 16
  assert steps.num_micro_batches((128, 512), 0) == 1
  with pytest.raises(ValueError, match="16 rows .at length 32768. do not divide the batch size 24"):
    steps.num_micro_batches((24, 32768), mbs)


@pytest.mark.parametrize("text, message", [
    ("8192", "is not '<max length>:<rows>'"), ("8192:64,abc:2", "'abc:2' is not"),
    ("8192:0", "must be > 0"), ("8192:64,4096:8", "lengths must increase")])
def test_malformed_entries_name_the_key(text, message):
  config = config_lib.default_learner_config()
  config.batching.micro_batch_by_length = text
  with pytest.raises(ValueError, match=f"batching.micro_batch_by_length: .*{message}"):
    config_lib.validate_learner_config(config)


def test_rows_must_split_over_the_batch_shards():
  micro_batching.parse(8, "8192:64").check_shards(8)
  with pytest.raises(ValueError, match=r"micro_batch_by_length \(8192:12\): 12 rows must be a multiple of the batch"):
    micro_batching.parse(8, "8192:12").check_shards(8)
  with pytest.raises(ValueError, match="batching.micro_batch_size: 6 rows"):
    micro_batching.parse(6, "").check_shards(4)
