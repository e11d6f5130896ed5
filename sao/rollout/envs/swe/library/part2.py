"""Library modules: parsing, search, geometry, caching, codecs (second half)."""
from sao.rollout.envs.swe.library.base import Bug, C, ModuleTemplate

MODULES = (
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
