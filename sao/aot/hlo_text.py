"""The text of an optimized HLO module (`compiled.as_text()`) as data: computations, instructions, shapes, the
metadata jax leaves on each instruction, and the trip counts of while loops.

Pure parsing (no jax): `sao.aot.hlo_cost` prices what this module reads, `experiments/bench/hlo_breakdown.py` prints it.

The grammar read is what XLA prints (`HloInstruction::ToString`), one instruction a line:

    [ROOT] %name = <shape> <opcode>(<operands>), <attribute>=<value>, …, metadata={op_name="…" stack_frame_id=N}

where a shape is `dtype[d0,d1,…]{layout}` or a tuple `(shape, shape, …)`, and a computation opens with
`[ENTRY] %name (params) -> shape {` and closes with `}`. The module's `FileNames` / `FunctionNames` /
`FileLocations` / `StackFrames` tables (jax ≥ 0.4.36) give each instruction the Python stack that made it.
"""
from __future__ import annotations

import dataclasses
import gzip
import math
import re

# Bytes per element; a dtype not here is an error (better than a silent 0).
DTYPE_BYTES = {"pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2,
               "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
               "token": 0}
_LEAF = re.compile(r"([a-z][a-z0-9]*)\[([0-9,<=]*)\](\{[^}]*\})?")
_HEAD = re.compile(r"^\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*\(.*->.*\{\s*$")
_CALLED = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_CALLED_LIST = re.compile(r"\b(branch_computations|called_computations)=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_TABLE_ROW = re.compile(r'^(\d+)\s+(?:"(.*)"|\{(.*)\})\s*$')


def _dtype_bytes(dtype: str) -> float:
  if dtype in DTYPE_BYTES:
    return DTYPE_BYTES[dtype]
  if dtype.startswith("f8"):
    return 1
  if dtype.startswith("f4"):
    return 0.5
  raise ValueError(f"HLO: unknown element type {dtype!r}")


@dataclasses.dataclass(frozen=True)
class Leaf:
  """One array of a (possibly tuple) shape: element type, dims, and its memory space (0 = HBM; 1 = the core's
  on-chip vector memory, `S(1)` in the layout)."""
  dtype: str
  dims: tuple[int, ...]
  memory_space: int = 0

  @property
  def bytes(self) -> float:
    return _dtype_bytes(self.dtype) * math.prod(self.dims)


def parse_shape(text: str) -> list[Leaf]:
  """Every array in a shape's text, in order: `bf16[8,128]{1,0:T(8,128)(2,1)}` → [Leaf("bf16", (8, 128))]."""
  leaves = []
  for dtype, dims, layout in _LEAF.findall(text):
    space = re.search(r"S\((\d+)\)", layout or "")
    leaves.append(Leaf(dtype, tuple(int(d.replace("<=", "")) for d in dims.split(",") if d),
                       int(space.group(1)) if space else 0))
  return leaves


def _closing(text: str, start: int) -> int:
  """Index of the bracket closing the one at `text[start]` (round or curly)."""
  depth = 0
  for i in range(start, len(text)):
    c = text[i]
    if c in "({":
      depth += 1
    elif c in ")}":
      depth -= 1
      if depth == 0:
        return i
  raise ValueError(f"HLO: unbalanced brackets in {text[start:start + 200]!r}")


@dataclasses.dataclass
class Instruction:
  name: str
  opcode: str
  shape: list[Leaf]
  operands: list[str]  # names of the operand instructions
  operand_text: str  # what stands between the opcode's parentheses (a constant's literal)
  attrs: str  # everything after the operand list
  op_name: str  # jax's name stack (metadata), "" when XLA kept none
  stack_frame: int  # metadata stack_frame_id, 0 when absent
  called: dict[str, list[str]]  # body / condition / calls / to_apply / branch_computations … → computation names
  is_root: bool

  @property
  def bytes(self) -> float:
    return sum(leaf.bytes for leaf in self.shape)

  def attr(self, key: str) -> str | None:
    """The raw value of `key=` in the attributes (a `{…}` value whole), or None."""
    match = re.search(r"(?:^|[\s,])" + re.escape(key) + r"=", self.attrs)
    if not match:
      return None
    start = match.end()
    if start < len(self.attrs) and self.attrs[start] == "{":
      return self.attrs[start:_closing(self.attrs, start) + 1]
    end = self.attrs.find(",", start)
    return self.attrs[start:end if end >= 0 else len(self.attrs)].strip()


@dataclasses.dataclass
class Computation:
  name: str
  instructions: list[Instruction]
  is_entry: bool

  def __post_init__(self):
    self.by_name = {i.name: i for i in self.instructions}
    roots = [i for i in self.instructions if i.is_root]
    self.root = roots[0] if roots else (self.instructions[-1] if self.instructions else None)
    self.users: dict[str, list[Instruction]] = {}
    for inst in self.instructions:
      for operand in inst.operands:
        self.users.setdefault(operand, []).append(inst)

  def parameter(self, index: int) -> Instruction:
    for inst in self.instructions:
      if inst.opcode == "parameter" and inst.operand_text.strip() == str(index):
        return inst
    raise ValueError(f"HLO: computation {self.name} has no parameter({index})")


@dataclasses.dataclass
class Module:
  computations: dict[str, Computation]
  entry: str
  files: dict[int, str]
  functions: dict[int, str]
  locations: dict[int, tuple[int, int]]  # file location id → (file id, function id)
  frames: dict[int, tuple[int, int]]  # stack frame id → (file location id, parent frame id)

  def stack(self, frame: int) -> list[tuple[str, str]]:
    """(file, function) of a stack frame and its callers, innermost first."""
    chain, seen = [], set()
    while frame in self.frames and frame not in seen:
      seen.add(frame)
      location, parent = self.frames[frame]
      file_id, function_id = self.locations.get(location, (0, 0))
      chain.append((self.files.get(file_id, ""), self.functions.get(function_id, "")))
      frame = parent
    return chain


def parse_instruction(line: str) -> Instruction | None:
  head = _HEAD.match(line)
  if not head:
    return None
  rest = line[head.end():]
  if rest.startswith("("):
    end = _closing(rest, 0)
    shape_text, rest = rest[:end + 1], rest[end + 1:].lstrip()
  else:
    shape_text, _, rest = rest.partition(" ")
  opcode_match = re.match(r"([\w\-]+)\(", rest)
  if not opcode_match:
    raise ValueError(f"HLO: cannot read the opcode of {line[:200]!r}")
  open_at = opcode_match.end() - 1
  close_at = _closing(rest, open_at)
  operand_text, attrs = rest[open_at + 1:close_at], rest[close_at + 1:]
  called: dict[str, list[str]] = {}
  for key, name in _CALLED.findall(attrs):
    called.setdefault(key, []).append(name)
  for key, names in _CALLED_LIST.findall(attrs):
    called[key] = [n.strip().lstrip("%") for n in names.split(",") if n.strip()]
  op_name = _OP_NAME.search(attrs)
  frame = _FRAME.search(attrs)
  return Instruction(head.group(2), opcode_match.group(1), parse_shape(shape_text),
                     re.findall(r"%([\w.\-]+)", operand_text), operand_text, attrs,
                     op_name.group(1) if op_name else "", int(frame.group(1)) if frame else 0, called,
                     bool(head.group(1)))


def _joined_lines(text: str):
  """The lines of `text`, an instruction that spans several lines joined into one: a frontend attribute may hold a
  multi-line value (Pallas splash attention's `kernel_metadata={` newline `"xprof_metadata":"{…}"` newline `}}, …`),
  so an instruction (an indented line) whose curly brackets outside strings are left open continues on the next."""
  pending, depth = [], 0
  for line in text.splitlines():
    if pending or line[:1].isspace():
      depth += _open_curly(line)
    if depth > 0:
      pending.append(line)
      continue
    yield "".join(pending + [line])
    pending, depth = [], 0
  if pending:
    yield "".join(pending)


def _open_curly(line: str) -> int:
  """`{` minus `}` in `line`, outside double-quoted strings (which may escape their quotes)."""
  depth, quoted, escaped = 0, False, False
  for c in line:
    if quoted:
      escaped, quoted = (False, True) if escaped else (c == "\\", c != '"')
    elif c == '"':
      quoted = True
    elif c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
  return depth


def parse_module(text: str) -> Module:
  """The module in `text` (as `compiled.as_text()` prints it)."""
  computations: dict[str, Computation] = {}
  tables: dict[str, dict[int, str]] = {"FileNames": {}, "FunctionNames": {}, "FileLocations": {}, "StackFrames": {}}
  entry, section, current, body = "", None, None, []
  for line in _joined_lines(text):
    if current is not None:
      if line.startswith("}"):  # `}` or `}, execution_thread="sparsecore"`
        computations[current[0]] = Computation(current[0], body, current[1])
        current, body = None, []
      elif line.strip():
        inst = parse_instruction(line)
        if inst is None:
          raise ValueError(f"HLO: cannot read {line[:200]!r} in computation {current[0]}")
        body.append(inst)
      continue
    if line.startswith("HloModule") or not line.strip():
      section = None
      continue
    if line.strip() in tables:
      section = line.strip()
      continue
    header = _COMPUTATION.match(line)
    if header:
      current, section = (header.group(2), bool(header.group(1))), None
      if header.group(1):
        entry = header.group(2)
      continue
    row = _TABLE_ROW.match(line.strip())
    if section and row:
      tables[section][int(row.group(1))] = row.group(2) if row.group(2) is not None else row.group(3)
  if not entry:
    raise ValueError("HLO: no ENTRY computation (is this an HLO module's text?)")
  ints = lambda s, *keys: tuple(int(re.search(k + r"=(\d+)", s).group(1)) if re.search(k + r"=(\d+)", s) else 0
                                for k in keys)
  return Module(computations, entry, tables["FileNames"], tables["FunctionNames"],
                {k: ints(v, "file_name_id", "function_name_id") for k, v in tables["FileLocations"].items()},
                {k: ints(v, "file_location_id", "parent_frame_id") for k, v in tables["StackFrames"].items()})


def read_module(path: str) -> Module:
  """`parse_module` of a file, gzipped (`compile_tpu.py --hlo_dir` writes `.hlo.txt.gz`) or plain."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    return parse_module(f.read())


# --------------------------------------------------------------------------------------------- loop trip counts
_FLIP = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "EQ": "EQ", "NE": "NE"}


def _through_casts(comp: Computation, name: str) -> Instruction | None:
  """The instruction `name` is, looking through bitcasts, converts and copies (None if it is not in `comp`)."""
  inst = comp.by_name.get(name)
  while inst is not None and inst.opcode in ("bitcast", "convert", "copy") and inst.operands:
    inst = comp.by_name.get(inst.operands[0])
  return inst


def _constant(comp: Computation, name: str) -> int | None:
  inst = _through_casts(comp, name)
  if inst is None or inst.opcode != "constant":
    return None
  try:
    return int(float(inst.operand_text))
  except ValueError:
    return None


def _tuple_index(comp: Computation, name: str) -> int | None:
  """`k` when `name` is `get-tuple-element(parameter, index=k)` (through bitcasts / converts)."""
  inst = _through_casts(comp, name)
  if inst is None or inst.opcode != "get-tuple-element":
    return None
  source = comp.by_name.get(inst.operands[0])
  if source is None or source.opcode != "parameter":
    return None
  return int(inst.attr("index"))


def trip_count(module: Module, caller: Computation, loop: Instruction) -> tuple[int | None, str]:
  """How many times `loop` (a `while` in `caller`) runs its body, and how that was found: XLA's
  `known_trip_count`, or derived from the condition `counter <cmp> constant`, the counter's initial value in the
  loop's init tuple and its constant step in the body. (None, why) when neither works."""
  known = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"', loop.attrs)
  if known:
    return int(known.group(1)), "known_trip_count"
  cond = module.computations[loop.called["condition"][0]]
  body = module.computations[loop.called["body"][0]]
  root = cond.root
  if root is None or root.opcode != "compare" or len(root.operands) != 2:
    return None, f"condition {cond.name} is not a compare"
  direction = (root.attr("direction") or "").strip()
  index, bound = _tuple_index(cond, root.operands[0]), _constant(cond, root.operands[1])
  if index is None:
    index, bound, direction = _tuple_index(cond, root.operands[1]), _constant(cond, root.operands[0]), \
        _FLIP.get(direction, direction)
  if index is None or bound is None:
    return None, f"condition {cond.name} does not compare a counter with a constant"
  init = caller.by_name.get(loop.operands[0])
  start = _constant(caller, init.operands[index]) if init is not None and init.opcode == "tuple" else None
  step = None
  if body.root is not None and body.root.opcode == "tuple":
    update = _through_casts(body, body.root.operands[index])  # e.g. copy(add(counter, 1))
    if update is not None and update.opcode in ("add", "subtract") and len(update.operands) == 2:
      a, b = update.operands
      if _tuple_index(body, a) == index and _constant(body, b) is not None:
        step = _constant(body, b) * (1 if update.opcode == "add" else -1)
      elif update.opcode == "add" and _tuple_index(body, b) == index and _constant(body, a) is not None:
        step = _constant(body, a)
  if start is None or not step:
    return None, f"counter {index} of {body.name}: no constant start or step"
  span = {"LT": bound - start, "LE": bound - start + step, "GT": start - bound, "GE": start - bound - step,
          "NE": bound - start}.get(direction)
  if span is None:
    return None, f"condition {cond.name}: direction {direction}"
  step = abs(step)
  return max(0, -(-span // step)), "derived from the loop condition"
