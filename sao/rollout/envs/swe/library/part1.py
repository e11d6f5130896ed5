"""Library modules: numbers, text, collections (first half)."""
from sao.rollout.envs.swe.library.base import Bug, C, ModuleTemplate

MODULES = (
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
)
