"""`sao.analysis.stats` against float64 references: textbook t quantiles and scipy's own t-test intervals."""
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from sao.analysis import stats


def test_t_quantiles_match_the_tables():
  for df, t in ((1, 12.706204736174705), (2, 4.302652729749464), (4, 2.7764451051977934), (30, 2.0422724563012373)):
    assert stats.t_quantile(0.975, df) == pytest.approx(t, rel=1e-12)
  with pytest.raises(ValueError, match="df"):
    stats.t_quantile(0.975, 0)


def test_mean_interval_by_hand_and_against_scipy():
  x = [61.25, 58.5, 66.0, 63.75, 60.0]
  iv = stats.mean_interval(x)
  mean, sd = math.fsum(x) / 5, math.sqrt(math.fsum((v - math.fsum(x) / 5) ** 2 for v in x) / 4)
  half = 2.7764451051977934 * sd / math.sqrt(5)
  assert (iv.mean, iv.low, iv.high, iv.n) == pytest.approx((mean, mean - half, mean + half, 5), rel=1e-12)
  ref = scipy_stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
  assert (iv.low, iv.high) == pytest.approx((ref.low, ref.high), rel=1e-12)
  # Non-finite values (a run that never reached the threshold) are left out; one value has no interval.
  assert stats.mean_interval(x + [math.nan]).n == 5
  one = stats.mean_interval([3.0, math.inf])
  assert one.mean == 3.0 and one.n == 1 and math.isnan(one.low)
  assert stats.format_interval(one) == "3.0 (n=1)" and stats.format_interval(stats.mean_interval([])) == "—"


def test_paired_and_welch_differences_against_scipy():
  a = {0: 62.0, 1: 60.5, 2: 66.25, 3: 59.0}
  b = {0: 55.5, 1: 57.0, 2: 58.75, 3: 56.0}
  paired = stats.difference_interval(a, b)
  ref = scipy_stats.ttest_rel(list(a.values()), list(b.values())).confidence_interval(0.95)
  assert paired.method == "paired t" and paired.n == 4
  assert (paired.low, paired.high) == pytest.approx((ref.low, ref.high), rel=1e-12)
  b_missing = {0: 55.5, 1: 57.0, 2: math.nan}  # seed 2 failed to reach, seed 3 absent: seed sets differ -> Welch
  welch = stats.difference_interval(a, b_missing)
  ref = scipy_stats.ttest_ind(list(a.values()), [55.5, 57.0], equal_var=False).confidence_interval(0.95)
  assert welch.method == "Welch t" and (welch.low, welch.high) == pytest.approx((ref.low, ref.high), rel=1e-12)
  assert welch.mean == pytest.approx(np.mean(list(a.values())) - 56.25, rel=1e-12)


def test_ratio_interval_is_per_seed():
  iv = stats.ratio_interval({0: 8.0, 1: 6.0, 2: 1.0}, {0: 2.0, 1: 2.0, 3: 5.0})
  assert iv.n == 2 and iv.mean == pytest.approx(3.5)  # seeds 0 and 1: 4 and 3
  assert stats.format_interval(stats.difference_interval({0: 1.0, 1: 2.1}, {0: 0.5, 1: 1.0}), signed=True).startswith(
      "+0.8 [")
