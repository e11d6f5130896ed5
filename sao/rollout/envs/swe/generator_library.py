"""The module library of the generated SWE dataset: small correct Python modules, their test cases, planted bugs.

A `ModuleTemplate` is a module's source (a `string.Template`: `${NAME}` placeholders take per-repository values from
`params`, and `${NAME_ALT}` a different value of the same list, for wrong-default bugs), its test cases, and its
bugs. A `Case` is a pytest test: optional setup lines, then an expression that must equal the value the correct
module computes, or raise `raises`. A `Bug` replaces one snippet (exactly one occurrence in the module) with a
buggy one; which tests it breaks is computed by running the cases, never written by hand.
"""
from __future__ import annotations

import dataclasses

BUG_KINDS = ("off_by_one", "wrong_operator", "wrong_default", "swapped_arguments", "missing_edge_case",
             "wrong_exception")


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  expr: str
  setup: tuple[str, ...] = ()
  raises: str | None = None


@dataclasses.dataclass(frozen=True)
class Bug:
  kind: str
  symbol: str  # the function or method holding the bug (the expert greps for it)
  correct: str
  buggy: str

  def __post_init__(self):
    if self.kind not in BUG_KINDS:
      raise ValueError(f"bug kind {self.kind!r} is not one of {BUG_KINDS}")


@dataclasses.dataclass(frozen=True)
class ModuleTemplate:
  name: str
  doc: str
  source: str
  cases: tuple[Case, ...]
  bugs: tuple[Bug, ...]
  params: dict = dataclasses.field(default_factory=dict)


def C(name, expr, *setup, raises=None):  # noqa: N802 — a terse constructor keeps the tables readable
  return Case(name, expr, tuple(setup), raises)


LIBRARY = (
    ModuleTemplate("intervals", "Interval arithmetic helpers.", '''
def clamp(value, low, high):
    """Limit value to the closed interval [low, high]."""
    if low > high:
        raise ValueError("low must not exceed high")
    if value < low:
        return low
    if value > high:
        return high
    return value


def overlap(a_start, a_end, b_start, b_end):
    """Length of the overlap of the half-open intervals [a_start, a_end) and [b_start, b_end)."""
    start = max(a_start, b_start)
    end = min(a_end, b_end)
    return max(0, end - start)


def chunk_bounds(n, size=${SIZE}):
    """(start, end) pairs that split range(n) into chunks of at most size items."""
    if size <= 0:
        raise ValueError("size must be positive")
    return [(i, min(i + size, n)) for i in range(0, n, size)]
''', (C("clamp_inside", "clamp(5, 0, 10)"), C("clamp_below", "clamp(-3, 0, 10)"), C("clamp_above", "clamp(42, 0, 10)"),
      C("clamp_at_high", "clamp(10, 0, 10)"), C("clamp_bad_bounds", "clamp(1, 5, 2)", raises="ValueError"),
      C("overlap_partial", "overlap(0, 5, 3, 8)"), C("overlap_disjoint", "overlap(0, 3, 5, 8)"),
      C("overlap_nested", "overlap(2, 9, 0, 20)"), C("overlap_touching", "overlap(0, 5, 5, 9)"),
      C("chunks_uneven", "chunk_bounds(7, 3)"), C("chunks_even", "chunk_bounds(6, 2)"),
      C("chunks_empty", "chunk_bounds(0, 3)"),
      C("chunks_default_size", "chunk_bounds(10)"), C("chunks_zero_size", "chunk_bounds(3, 0)", raises="ValueError")),
     (Bug("wrong_operator", "clamp", "        return high\n", "        return low\n"),
      Bug("missing_edge_case", "clamp",
          '    if low > high:\n        raise ValueError("low must not exceed high")\n', ""),
      Bug("off_by_one", "overlap", "max(0, end - start)", "max(0, end - start + 1)"),
      Bug("wrong_operator", "overlap", "start = max(a_start, b_start)", "start = min(a_start, b_start)"),
      Bug("off_by_one", "chunk_bounds", "min(i + size, n)", "min(i + size, n - 1)"),
      Bug("wrong_exception", "chunk_bounds", 'raise ValueError("size must be positive")',
          'raise TypeError("size must be positive")'),
      Bug("wrong_default", "chunk_bounds", "size=${SIZE}", "size=${SIZE_ALT}")),
     {"SIZE": (3, 4, 5)}),
    ModuleTemplate("text", "Small text utilities.", '''
def truncate(text, width=${WIDTH}, suffix="..."):
    """Shorten text to at most width characters, ending with suffix when it is cut."""
    if len(text) <= width:
        return text
    return text[:width - len(suffix)] + suffix


def slugify(text, sep="-"):
    """The lower-case words of text joined by sep; other characters are dropped."""
    words = []
    current = ""
    for ch in text.lower():
        if ch.isalnum():
            current += ch
        elif current:
            words.append(current)
            current = ""
    if current:
        words.append(current)
    return sep.join(words)


def count_words(text, min_length=1):
    """Number of whitespace-separated words with at least min_length characters."""
    return sum(1 for word in text.split() if len(word) >= min_length)
''', (C("truncate_short", 'truncate("hello", 10)'), C("truncate_exact", 'truncate("abcdefgh", 8)'),
      C("truncate_long", 'truncate("abcdefghijkl", 8)'), C("truncate_default", 'truncate("x" * 40)'),
      C("truncate_default_short", 'truncate("short")'),
      C("slugify_words", 'slugify("Hello World")'), C("slugify_punctuation", 'slugify("  Fast, cheap & good! ")'),
      C("slugify_sep", 'slugify("a b c", sep="_")'), C("slugify_trailing_word", 'slugify("end of line")'),
      C("count_words_plain", 'count_words("one two three")'), C("count_words_min", 'count_words("a bb ccc dddd", 3)'),
      C("count_words_exact_min", 'count_words("ab cd e", 2)'), C("count_words_default", 'count_words("a b c")')),
     (Bug("off_by_one", "truncate", "if len(text) <= width:", "if len(text) < width:"),
      Bug("wrong_default", "truncate", "width=${WIDTH}", "width=${WIDTH_ALT}"),
      Bug("missing_edge_case", "slugify", "    if current:\n        words.append(current)\n", ""),
      Bug("wrong_default", "slugify", 'def slugify(text, sep="-"):', 'def slugify(text, sep="_"):'),
      Bug("off_by_one", "count_words", "len(word) >= min_length", "len(word) > min_length"),
      Bug("wrong_default", "count_words", "min_length=1", "min_length=2")),
     {"WIDTH": (12, 16, 20, 24)}),
    ModuleTemplate("stats", "Descriptive statistics.", '''
def mean(values):
    """Arithmetic mean; 0.0 when there are no values."""
    if not values:
        return 0.0
    return sum(values) / len(values)


def median(values):
    """Median of values; raises ValueError when there are none."""
    if not values:
        raise ValueError("median of empty data")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def moving_sum(values, window=${WINDOW}):
    """Sums of every run of window consecutive values."""
    return [sum(values[i:i + window]) for i in range(len(values) - window + 1)]
''', (C("mean_ints", "mean([1, 2, 3, 4])"), C("mean_single", "mean([7])"), C("mean_empty", "mean([])"),
      C("median_odd", "median([5, 1, 3])"), C("median_even", "median([4, 1, 3, 2])"),
      C("median_empty", "median([])", raises="ValueError"), C("median_single", "median([9])"),
      C("moving_sum_pairs", "moving_sum([1, 2, 3, 4], 2)"), C("moving_sum_full", "moving_sum([1, 2, 3], 3)"),
      C("moving_sum_default", "moving_sum(list(range(8)))"), C("moving_sum_too_short", "moving_sum([1], 2)")),
     (Bug("missing_edge_case", "mean", "    if not values:\n        return 0.0\n", ""),
      Bug("off_by_one", "median", "(ordered[mid - 1] + ordered[mid]) / 2", "(ordered[mid] + ordered[mid + 1]) / 2"),
      Bug("wrong_exception", "median", 'raise ValueError("median of empty data")',
          'raise IndexError("median of empty data")'),
      Bug("off_by_one", "moving_sum", "range(len(values) - window + 1)", "range(len(values) - window)"),
      Bug("wrong_default", "moving_sum", "window=${WINDOW}", "window=${WINDOW_ALT}")),
     {"WINDOW": (2, 3, 4)}),
    ModuleTemplate("inventory", "Stock keeping with a per-item capacity.", '''
class Inventory:
    """Item counts, each at most capacity."""

    def __init__(self, capacity=${CAPACITY}):
        self.capacity = capacity
        self.items = {}

    def add(self, name, count=1):
        """Adds count items of name; returns the new count."""
        if count <= 0:
            raise ValueError("count must be positive")
        new = self.items.get(name, 0) + count
        if new > self.capacity:
            raise OverflowError(f"{name}: capacity {self.capacity} exceeded")
        self.items[name] = new
        return new

    def remove(self, name, count=1):
        """Removes count items of name; returns how many are left."""
        have = self.items.get(name, 0)
        if count > have:
            raise KeyError(name)
        if count == have:
            del self.items[name]
        else:
            self.items[name] = have - count
        return have - count

    def total(self):
        return sum(self.items.values())
''', (C("add_new", 'inv.add("apple", 2)', "inv = Inventory(capacity=5)"),
      C("add_to_capacity", 'inv.add("apple", 3)', "inv = Inventory(capacity=5)", 'inv.add("apple", 2)'),
      C("add_over_capacity", 'inv.add("apple", 4)', "inv = Inventory(capacity=5)", 'inv.add("apple", 2)',
        raises="OverflowError"),
      C("add_zero", 'inv.add("apple", 0)', "inv = Inventory()", raises="ValueError"),
      C("default_capacity", "inv.capacity", "inv = Inventory()"),
      C("remove_some", 'inv.remove("pear", 1)', "inv = Inventory(capacity=9)", 'inv.add("pear", 3)'),
      C("remove_all", 'inv.items', "inv = Inventory(capacity=9)", 'inv.add("pear", 3)', 'inv.remove("pear", 3)'),
      C("remove_missing", 'inv.remove("plum")', "inv = Inventory()", raises="KeyError"),
      C("total", "inv.total()", "inv = Inventory(capacity=9)", 'inv.add("a", 2)', 'inv.add("b", 4)')),
     (Bug("off_by_one", "add", "if new > self.capacity:", "if new >= self.capacity:"),
      Bug("wrong_exception", "remove", "raise KeyError(name)", "raise ValueError(name)"),
      Bug("wrong_operator", "remove", "if count > have:", "if count >= have:"),
      Bug("wrong_default", "__init__", "capacity=${CAPACITY}", "capacity=${CAPACITY_ALT}")),
     {"CAPACITY": (10, 50, 100)}),
    ModuleTemplate("money", "Prices, discounts and currency conversion.", '''
def apply_discount(price, percent):
    """price reduced by percent (0 to 100), rounded to cents."""
    if not 0 <= percent <= 100:
        raise ValueError("percent must be within 0..100")
    return round(price * (100 - percent) / 100, 2)


def split_bill(total, people, tip_percent=${TIP}):
    """Each person's share of total plus the tip, rounded to cents."""
    if people < 1:
        raise ValueError("need at least one person")
    return round(total * (1 + tip_percent / 100) / people, 2)


def convert(amount, rate, fee=0.0):
    """amount converted at rate after deducting a flat fee."""
    return round((amount - fee) * rate, 2)


def price_in_currency(price, percent, rate):
    """The discounted price converted at rate."""
    return convert(apply_discount(price, percent), rate)
''', (C("discount_half", "apply_discount(80.0, 50)"), C("discount_none", "apply_discount(19.99, 0)"),
      C("discount_quarter", "apply_discount(100.0, 25)"),
      C("discount_invalid", "apply_discount(10.0, 150)", raises="ValueError"),
      C("split_two", "split_bill(100.0, 2, 0)"), C("split_tip", "split_bill(100.0, 4, 20)"),
      C("split_default_tip", "split_bill(50.0, 1)"), C("split_nobody", "split_bill(10.0, 0)", raises="ValueError"),
      C("convert_plain", "convert(10.0, 1.5)"), C("convert_fee", "convert(10.0, 2.0, 1.0)"),
      C("price_in_currency", "price_in_currency(200.0, 10, 0.5)")),
     (Bug("wrong_operator", "apply_discount", "(100 - percent)", "(100 + percent)"),
      Bug("missing_edge_case", "apply_discount",
          '    if not 0 <= percent <= 100:\n        raise ValueError("percent must be within 0..100")\n', ""),
      Bug("wrong_default", "split_bill", "tip_percent=${TIP}", "tip_percent=${TIP_ALT}"),
      Bug("swapped_arguments", "price_in_currency", "convert(apply_discount(price, percent), rate)",
          "convert(apply_discount(percent, price), rate)"),
      Bug("wrong_operator", "convert", "(amount - fee) * rate", "(amount + fee) * rate")),
     {"TIP": (10, 15, 18)}),
    ModuleTemplate("calendar_utils", "Calendar arithmetic without datetime.", '''
DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_leap(year):
    """Gregorian leap years."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    """Days in month (1 to 12) of year."""
    if not 1 <= month <= 12:
        raise ValueError(f"month out of range: {month}")
    if month == 2 and is_leap(year):
        return 29
    return DAYS_IN_MONTH[month - 1]


def day_of_year(year, month, day):
    """1-based ordinal of the date within its year."""
    return sum(days_in_month(year, m) for m in range(1, month)) + day
''', (C("leap_2024", "is_leap(2024)"), C("leap_2023", "is_leap(2023)"), C("leap_1900", "is_leap(1900)"),
      C("leap_2000", "is_leap(2000)"), C("days_january", "days_in_month(2023, 1)"),
      C("days_february_leap", "days_in_month(2024, 2)"), C("days_december", "days_in_month(2023, 12)"),
      C("days_bad_month", "days_in_month(2023, 13)", raises="ValueError"),
      C("day_of_year_jan", "day_of_year(2023, 1, 5)"),
      C("day_of_year_march", "day_of_year(2024, 3, 1)"), C("day_of_year_dec", "day_of_year(2023, 12, 31)")),
     (Bug("wrong_operator", "is_leap", "year % 100 != 0", "year % 100 == 0"),
      Bug("missing_edge_case", "is_leap", "(year % 100 != 0 or year % 400 == 0)", "year % 100 != 0"),
      Bug("off_by_one", "days_in_month", "DAYS_IN_MONTH[month - 1]", "DAYS_IN_MONTH[month % 12]"),
      Bug("off_by_one", "day_of_year", "range(1, month)", "range(1, month + 1)"),
      Bug("swapped_arguments", "day_of_year", "days_in_month(year, m)", "days_in_month(m, year)"))),
    ModuleTemplate("matrix", "Dense matrices as lists of rows.", '''
def transpose(rows):
    """Rows become columns."""
    if not rows:
        return []
    return [[row[i] for row in rows] for i in range(len(rows[0]))]


def matmul(a, b):
    """Matrix product of a (n x m) and b (m x p)."""
    if len(a[0]) != len(b):
        raise ValueError("shapes do not match")
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def identity(n):
    """The n x n identity matrix."""
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]
''', (C("transpose_square", "transpose([[1, 2], [3, 4]])"), C("transpose_row", "transpose([[1, 2, 3]])"),
      C("transpose_empty", "transpose([])"), C("matmul_square", "matmul([[1, 2], [3, 4]], [[5, 6], [7, 8]])"),
      C("matmul_vector", "matmul([[1, 2, 3]], [[1], [0], [2]])"),
      C("matmul_mismatch", "matmul([[1, 2]], [[1, 2]])", raises="ValueError"),
      C("identity_2", "identity(2)"), C("identity_3", "identity(3)")),
     (Bug("missing_edge_case", "transpose", "    if not rows:\n        return []\n", ""),
      Bug("wrong_exception", "matmul", 'raise ValueError("shapes do not match")',
          'raise IndexError("shapes do not match")'),
      Bug("wrong_operator", "matmul", "a[i][k] * b[k][j]", "a[i][k] + b[k][j]"),
      Bug("swapped_arguments", "matmul", "a[i][k] * b[k][j]", "a[k][i] * b[j][k]"),
      Bug("wrong_operator", "identity", "1 if i == j else 0", "1 if i != j else 0"))),
    ModuleTemplate("ring", "A fixed-size ring buffer.", '''
class RingBuffer:
    """Keeps the last capacity items pushed."""

    def __init__(self, capacity=${CAPACITY}):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.data = []

    def push(self, item):
        self.data.append(item)
        if len(self.data) > self.capacity:
            self.data.pop(0)

    def latest(self, n=1):
        """The n most recent items, oldest first."""
        if n > len(self.data):
            raise IndexError("not enough items")
        return self.data[len(self.data) - n:]
''', (C("push_under", "buf.data", "buf = RingBuffer(3)", "buf.push(1)", "buf.push(2)"),
      C("push_full", "buf.data", "buf = RingBuffer(3)", "for i in range(3):", "    buf.push(i)"),
      C("push_over", "buf.data", "buf = RingBuffer(3)", "for i in range(5):", "    buf.push(i)"),
      C("latest_two", "buf.latest(2)", "buf = RingBuffer(4)", "for i in range(4):", "    buf.push(i)"),
      C("latest_default", "buf.latest()", "buf = RingBuffer(4)", "buf.push(7)"),
      C("latest_too_many", "buf.latest(3)", "buf = RingBuffer(4)", "buf.push(1)", raises="IndexError"),
      C("bad_capacity", "RingBuffer(0)", raises="ValueError"), C("default_capacity", "RingBuffer().capacity")),
     (Bug("off_by_one", "push", "if len(self.data) > self.capacity:", "if len(self.data) >= self.capacity:"),
      Bug("wrong_exception", "latest", 'raise IndexError("not enough items")', 'raise ValueError("not enough items")'),
      Bug("off_by_one", "latest", "self.data[len(self.data) - n:]", "self.data[len(self.data) - n + 1:]"),
      Bug("wrong_default", "__init__", "capacity=${CAPACITY}", "capacity=${CAPACITY_ALT}")),
     {"CAPACITY": (8, 16, 32)}),
    ModuleTemplate("config", "Parsing of simple key=value configuration.", '''
def parse_pairs(text, sep="=", comment="#"):
    """A dict of the key/value lines of text; blank lines and comments are skipped."""
    result = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(comment):
            continue
        if sep not in line:
            raise ValueError(f"missing {sep!r} in line: {line!r}")
        key, value = line.split(sep, 1)
        result[key.strip()] = value.strip()
    return result


def parse_bool(value):
    """True for 1/true/yes/on, False for 0/false/no/off (any case, surrounding spaces ignored)."""
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def parse_size(text):
    """Bytes in a size like "512", "4k", "2M", "1g" (binary units)."""
    units = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
    text = text.strip().lower()
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)
''', (C("pairs_basic", 'parse_pairs("a=1\\nb = two")'), C("pairs_comments", 'parse_pairs("# c\\n\\nx=1")'),
      C("pairs_value_with_sep", 'parse_pairs("url=http://h/?q=1")'),
      C("pairs_missing_sep", 'parse_pairs("novalue")', raises="ValueError"),
      C("pairs_custom_sep", 'parse_pairs("k: v", sep=":")'), C("bool_true", 'parse_bool("Yes")'),
      C("bool_false", 'parse_bool("off")'), C("bool_spaces", 'parse_bool("  true ")'),
      C("bool_invalid", 'parse_bool("maybe")', raises="ValueError"), C("size_plain", 'parse_size("512")'),
      C("size_kilo", 'parse_size("4k")'), C("size_mega", 'parse_size("2M")'), C("size_giga", 'parse_size("1g")'),
      C("size_multi_digit", 'parse_size("16k")')),
     (Bug("missing_edge_case", "parse_pairs", "line.split(sep, 1)", "line.split(sep)"),
      Bug("wrong_default", "parse_pairs", 'comment="#"', 'comment=";"'),
      Bug("wrong_exception", "parse_bool", 'raise ValueError(f"not a boolean', 'raise KeyError(f"not a boolean'),
      Bug("missing_edge_case", "parse_bool", "lowered = value.strip().lower()", "lowered = value.lower()"),
      Bug("wrong_operator", "parse_size", '"m": 1024 ** 2', '"m": 1024 * 2'),
      Bug("off_by_one", "parse_size", "int(text[:-1])", "int(text[:1])"))),
    ModuleTemplate("search", "Searching in sequences.", '''
def binary_search(items, target):
    """Index of target in the sorted list items, or -1."""
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


def find_all(items, target, start=0):
    """Every index of target in items, from start on."""
    return [i for i in range(start, len(items)) if items[i] == target]


def first_greater(items, threshold):
    """Index of the first item greater than threshold, or None."""
    for i, item in enumerate(items):
        if item > threshold:
            return i
    return None
''', (C("bsearch_middle", "binary_search([1, 3, 5, 7, 9], 5)"), C("bsearch_last", "binary_search([1, 3, 5, 7, 9], 9)"),
      C("bsearch_first", "binary_search([1, 3, 5, 7, 9], 1)"), C("bsearch_missing", "binary_search([1, 3, 5], 4)"),
      C("bsearch_single", "binary_search([4], 4)"), C("find_all_many", "find_all([1, 2, 1, 1], 1)"),
      C("find_all_start", "find_all([1, 2, 1, 1], 1, 2)"), C("find_all_none", "find_all([2, 3], 1)"),
      C("first_greater_found", "first_greater([1, 5, 9], 4)"), C("first_greater_equal", "first_greater([1, 4, 9], 4)"),
      C("first_greater_none", "first_greater([1, 2], 5)")),
     (Bug("off_by_one", "binary_search", "while lo <= hi:", "while lo < hi:"),
      Bug("off_by_one", "binary_search", "lo, hi = 0, len(items) - 1", "lo, hi = 0, len(items) - 2"),
      Bug("wrong_operator", "first_greater", "if item > threshold:", "if item >= threshold:"),
      Bug("wrong_default", "find_all", "start=0", "start=1"))),
    ModuleTemplate("grading", "Exam scores and letter grades.", '''
def letter_grade(score):
    """A to F for a score from 0 to 100."""
    if not 0 <= score <= 100:
        raise ValueError(f"score out of range: {score}")
    if score >= 90:
        return "A"
    if score >= 80:
        return "B"
    if score >= 70:
        return "C"
    if score >= 60:
        return "D"
    return "F"


def average(scores, drop_lowest=False):
    """Mean score, optionally without the lowest one."""
    if not scores:
        raise ValueError("no scores")
    kept = sorted(scores)[1:] if drop_lowest and len(scores) > 1 else list(scores)
    return sum(kept) / len(kept)


def passing(scores, threshold=${PASS}):
    """The scores at or above threshold."""
    return [s for s in scores if s >= threshold]
''', (C("grade_a", "letter_grade(95)"), C("grade_b_boundary", "letter_grade(80)"), C("grade_c", "letter_grade(75)"),
      C("grade_f", "letter_grade(12)"), C("grade_out_of_range", "letter_grade(101)", raises="ValueError"),
      C("average_plain", "average([70, 80, 90])"), C("average_drop", "average([50, 80, 90], drop_lowest=True)"),
      C("average_single_drop", "average([60], drop_lowest=True)"),
      C("average_empty", "average([])", raises="ValueError"),
      C("passing_default", "passing([30, 49, 50, 51, 60, 75, 90])"), C("passing_custom", "passing([10, 20, 30], 20)")),
     (Bug("off_by_one", "letter_grade", "if score >= 80:", "if score > 80:"),
      Bug("missing_edge_case", "letter_grade",
          '    if not 0 <= score <= 100:\n        raise ValueError(f"score out of range: {score}")\n', ""),
      Bug("off_by_one", "average", "sorted(scores)[1:]", "sorted(scores)[2:]"),
      Bug("wrong_default", "average", "drop_lowest=False", "drop_lowest=True"),
      Bug("wrong_operator", "passing", "if s >= threshold]", "if s > threshold]"),
      Bug("wrong_default", "passing", "threshold=${PASS}", "threshold=${PASS_ALT}")),
     {"PASS": (50, 60, 75)}),
    ModuleTemplate("geometry", "Plane geometry helpers.", '''
def distance(p, q):
    """Euclidean distance of points p and q."""
    return ((p[0] - q[0]) ** 2 + (p[1] - q[1]) ** 2) ** 0.5


def rect_area(width, height):
    """Area of a width x height rectangle; sizes must not be negative."""
    if width < 0 or height < 0:
        raise ValueError("negative size")
    return width * height


def bounding_box(points):
    """(min_x, min_y, max_x, max_y) of the points."""
    if not points:
        raise ValueError("no points")
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    return (min(xs), min(ys), max(xs), max(ys))


def scale(point, factor, origin=(0, 0)):
    """point scaled by factor about origin."""
    return (origin[0] + (point[0] - origin[0]) * factor, origin[1] + (point[1] - origin[1]) * factor)
''', (C("distance_345", "distance((0, 0), (3, 4))"), C("distance_same", "distance((2, 2), (2, 2))"),
      C("distance_negative", "distance((-1, -1), (2, 3))"), C("area", "rect_area(3, 4)"),
      C("area_negative_width", "rect_area(-1, 4)", raises="ValueError"),
      C("area_negative_height", "rect_area(2, -4)", raises="ValueError"),
      C("bbox", "bounding_box([(1, 5), (3, -2), (0, 0)])"), C("bbox_empty", "bounding_box([])", raises="ValueError"),
      C("scale_origin", "scale((2, 3), 2)"), C("scale_about_point", "scale((3, 3), 2, (1, 1))")),
     (Bug("wrong_operator", "distance", "(p[1] - q[1]) ** 2", "(p[1] + q[1]) ** 2"),
      Bug("missing_edge_case", "rect_area", "if width < 0 or height < 0:", "if width < 0:"),
      Bug("swapped_arguments", "bounding_box", "(min(xs), min(ys), max(xs), max(ys))",
          "(min(ys), min(xs), max(ys), max(xs))"),
      Bug("wrong_default", "scale", "origin=(0, 0)", "origin=(1, 1)"))),
    ModuleTemplate("lru", "A least-recently-used cache.", '''
class LRUCache:
    """Holds at most capacity entries; the least recently used one is evicted first."""

    def __init__(self, capacity=${CAPACITY}):
        self.capacity = capacity
        self.order = []
        self.values = {}

    def get(self, key, default=None):
        if key not in self.values:
            return default
        self.order.remove(key)
        self.order.append(key)
        return self.values[key]

    def put(self, key, value):
        if key in self.values:
            self.order.remove(key)
        elif len(self.values) >= self.capacity:
            oldest = self.order.pop(0)
            del self.values[oldest]
        self.values[key] = value
        self.order.append(key)
''', (C("get_missing", 'cache.get("x")', "cache = LRUCache(2)"),
      C("get_default", 'cache.get("x", 5)', "cache = LRUCache(2)"),
      C("put_get", 'cache.get("a")', "cache = LRUCache(2)", 'cache.put("a", 1)'),
      C("evicts_oldest", "sorted(cache.values)", "cache = LRUCache(2)", 'cache.put("a", 1)', 'cache.put("b", 2)',
        'cache.put("c", 3)'),
      C("get_refreshes", "sorted(cache.values)", "cache = LRUCache(2)", 'cache.put("a", 1)', 'cache.put("b", 2)',
        'cache.get("a")', 'cache.put("c", 3)'),
      C("update_keeps_size", "len(cache.values)", "cache = LRUCache(2)", 'cache.put("a", 1)', 'cache.put("a", 2)'),
      C("default_capacity", "LRUCache().capacity")),
     (Bug("off_by_one", "put", "elif len(self.values) >= self.capacity:", "elif len(self.values) > self.capacity:"),
      Bug("off_by_one", "put", "oldest = self.order.pop(0)", "oldest = self.order.pop(-1)"),
      Bug("missing_edge_case", "get",
          "        self.order.remove(key)\n        self.order.append(key)\n        return self.values[key]",
          "        return self.values[key]"),
      Bug("wrong_default", "get", "def get(self, key, default=None):", "def get(self, key, default=0):"),
      Bug("wrong_default", "__init__", "capacity=${CAPACITY}", "capacity=${CAPACITY_ALT}")),
     {"CAPACITY": (64, 128, 256)}),
    ModuleTemplate("checks", "Argument validation helpers.", '''
def check_range(value, low, high, name="value"):
    """value, if low <= value <= high; else ValueError."""
    if value < low or value > high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def check_percent(value):
    return check_range(value, 0, 100, "percent")


def check_type(value, expected, name="value"):
    """value, if it is an instance of expected; else TypeError."""
    if not isinstance(value, expected):
        raise TypeError(f"{name} must be {expected.__name__}, got {type(value).__name__}")
    return value


def require_keys(mapping, keys):
    """mapping, if it has every key; else KeyError listing the missing ones."""
    missing = [k for k in keys if k not in mapping]
    if missing:
        raise KeyError(f"missing keys: {missing}")
    return mapping
''', (C("range_inside", "check_range(5, 0, 10)"), C("range_high_edge", "check_range(10, 0, 10)"),
      C("range_above", "check_range(11, 0, 10)", raises="ValueError"),
      C("range_below", "check_range(-1, 0, 10)", raises="ValueError"), C("percent_ok", "check_percent(42)"),
      C("percent_bad", "check_percent(120)", raises="ValueError"), C("type_ok", "check_type(3, int)"),
      C("type_bad", 'check_type("3", int)', raises="TypeError"), C("keys_ok", 'require_keys({"a": 1}, ["a"])'),
      C("keys_missing", 'require_keys({"a": 1}, ["a", "b"])', raises="KeyError")),
     (Bug("wrong_operator", "check_range", "value > high:", "value >= high:"),
      Bug("swapped_arguments", "check_percent", "check_range(value, 0, 100,", "check_range(value, 100, 0,"),
      Bug("wrong_exception", "check_type", "raise TypeError(f", "raise ValueError(f"),
      Bug("wrong_exception", "require_keys", 'raise KeyError(f"missing keys', 'raise LookupError(f"missing keys'),
      Bug("missing_edge_case", "check_range", "if value < low or value > high:", "if value > high:"))),
    ModuleTemplate("codec", "Run-length encoding and a Caesar cipher.", '''
def rle_encode(text):
    """[(char, run length), ...] of text."""
    if not text:
        return []
    runs = []
    current, count = text[0], 1
    for ch in text[1:]:
        if ch == current:
            count += 1
        else:
            runs.append((current, count))
            current, count = ch, 1
    runs.append((current, count))
    return runs


def rle_decode(runs):
    return "".join(ch * n for ch, n in runs)


def caesar(text, shift=${SHIFT}):
    """Lower-case letters rotated by shift; everything else unchanged."""
    out = []
    for ch in text:
        if "a" <= ch <= "z":
            out.append(chr((ord(ch) - ord("a") + shift) % 26 + ord("a")))
        else:
            out.append(ch)
    return "".join(out)
''', (C("encode_runs", 'rle_encode("aaabcc")'), C("encode_single", 'rle_encode("z")'),
      C("encode_empty", 'rle_encode("")'),
      C("decode", 'rle_decode([("a", 2), ("b", 1)])'), C("roundtrip", 'rle_decode(rle_encode("xxyyyz"))'),
      C("caesar_shift", 'caesar("abc", 1)'), C("caesar_wrap", 'caesar("xyz", 3)'),
      C("caesar_keeps_other", 'caesar("a-B!", 2)'),
      C("caesar_default", 'caesar("hello")')),
     (Bug("missing_edge_case", "rle_encode", "    runs.append((current, count))\n    return runs", "    return runs"),
      Bug("off_by_one", "rle_encode", "current, count = ch, 1", "current, count = ch, 0"),
      Bug("wrong_operator", "caesar", "% 26 + ord", "% 25 + ord"),
      Bug("wrong_default", "caesar", "shift=${SHIFT}", "shift=${SHIFT_ALT}")),
     {"SHIFT": (3, 5, 7, 13)}),
    ModuleTemplate("paging", "Pagination of result lists.", '''
def page_count(total, per_page=${PER_PAGE}):
    """Pages needed for total items."""
    if per_page < 1:
        raise ValueError("per_page must be positive")
    return (total + per_page - 1) // per_page


def page_slice(items, page, per_page=${PER_PAGE}):
    """The items on 1-based page."""
    if page < 1:
        raise ValueError("pages start at 1")
    start = (page - 1) * per_page
    return items[start:start + per_page]
''', (C("count_exact", "page_count(20, 10)"), C("count_partial", "page_count(21, 10)"),
      C("count_zero", "page_count(0, 10)"),
      C("count_default", "page_count(95)"), C("count_bad", "page_count(5, 0)", raises="ValueError"),
      C("slice_first", "page_slice(list(range(10)), 1, 4)"), C("slice_last", "page_slice(list(range(10)), 3, 4)"),
      C("slice_default", "page_slice(list(range(100)), 2)"),
      C("slice_bad_page", "page_slice([1, 2], 0)", raises="ValueError")),
     (Bug("off_by_one", "page_count", "(total + per_page - 1) // per_page", "(total + per_page) // per_page"),
      Bug("off_by_one", "page_slice", "start = (page - 1) * per_page", "start = page * per_page"),
      Bug("wrong_exception", "page_slice", 'raise ValueError("pages start at 1")',
          'raise IndexError("pages start at 1")'),
      Bug("wrong_default", "page_count", "def page_count(total, per_page=${PER_PAGE}):",
          "def page_count(total, per_page=${PER_PAGE_ALT}):")),
     {"PER_PAGE": (10, 20, 25)}),
)
