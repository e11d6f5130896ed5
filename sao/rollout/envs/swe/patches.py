"""Unified diffs, parsed and applied by the grader itself: no `git apply`, no `patch --fuzz`, no repository.

A patch is a sequence of file sections in git's unified format (`diff --git a/X b/Y`, extended headers, `--- a/X`,
`+++ b/Y`, hunks `@@ -l,s +l,s @@`) or plain unified format (`---`/`+++` without `diff --git`). Anything else —
a context diff (`*** a/x`), text between sections, a malformed hunk — makes the whole patch a `PatchError`: the
grader takes unified diffs only, so no tool's lenient reading of some other format decides what gets graded.

    changes = parse(diff)                       # [FileChange], in order
    new_text = apply(changes[0], old_text)      # exact context; a hunk may sit at another line (as `git apply`)
    diff = format_file(path, old_text, new_text)

Contents are `str` (files that are not UTF-8 text are "binary": their changes are parsed as such and never
applied). Pure functions, standard library only.
"""
from __future__ import annotations

import dataclasses
import difflib
import re

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_EXTENDED = ("old mode ", "new mode ", "deleted file mode ", "new file mode ", "similarity index ",
             "dissimilarity index ", "index ", "rename from ", "rename to ", "copy from ", "copy to ")
_NO_NEWLINE = "\\ No newline at end of file"
SYMLINK_MODE = "120000"
GITLINK_MODE = "160000"


def split_lines(text: str) -> list[str]:
  """`text` cut after each "\n" only, as git and diff cut lines (`str.splitlines` also cuts at "\r", form feeds,
  U+2028 and other separators that are ordinary characters inside a diff line)."""
  lines = text.split("\n")
  out = [line + "\n" for line in lines[:-1]]
  return out + [lines[-1]] if lines[-1] else out


class PatchError(ValueError):
  """The text is not a well-formed unified diff, or a hunk does not apply."""


@dataclasses.dataclass
class Hunk:
  old_start: int
  old_lines: list[str]   # context and removed lines, each with its newline (none on a last line without one)
  new_lines: list[str]   # context and added lines


@dataclasses.dataclass
class FileChange:
  """One file section. `old_path` None: the file is created; `new_path` None: deleted. `binary`: a binary change
  (never applied). `modes`: the modes the section names (a symlink or submodule is never applied either)."""
  old_path: str | None
  new_path: str | None
  hunks: list[Hunk] = dataclasses.field(default_factory=list)
  binary: bool = False
  modes: tuple[str, ...] = ()
  copy: bool = False

  @property
  def paths(self) -> list[str]:
    return [p for p in dict.fromkeys((self.old_path, self.new_path)) if p is not None]

  @property
  def special(self) -> bool:
    """A symlink, a submodule or binary content: nothing the grader writes into a graded tree."""
    return self.binary or any(m in (SYMLINK_MODE, GITLINK_MODE) for m in self.modes)


def _unquote(text: str) -> str:
  """A path as git writes it: C-quoted ("a/x\\tb") when it holds special characters."""
  if not text.startswith('"'):
    return text
  if len(text) < 2 or not text.endswith('"'):
    raise PatchError(f"unterminated quoted path {text!r}")
  raw, out, i = text[1:-1], bytearray(), 0
  escapes = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}
  while i < len(raw):
    ch = raw[i]
    if ch != "\\":
      out += ch.encode("utf-8")
      i += 1
    elif raw[i + 1:i + 2] in escapes:
      out.append(escapes[raw[i + 1]])
      i += 2
    elif re.fullmatch(r"[0-3][0-7]{2}", raw[i + 1:i + 4]):
      out.append(int(raw[i + 1:i + 4], 8))
      i += 4
    else:
      raise PatchError(f"bad escape in quoted path {text!r}")
  return out.decode("utf-8", "surrogateescape")


def _strip(path: str, prefix: str) -> str | None:
  """`a/x` -> `x` (git's prefixes), `/dev/null` -> None."""
  path = _unquote(path.split("\t")[0] if not path.startswith('"') else path)
  if path == "/dev/null":
    return None
  return path[len(prefix):] if path.startswith(prefix) else path


def _git_header_paths(rest: str) -> tuple[str, str]:
  """The two paths of `diff --git <rest>`: quoted, or split where both halves name the same file."""
  if rest.startswith('"'):
    end = rest.index('"', 1)
    while rest[end - 1] == "\\":
      end = rest.index('"', end + 1)
    return _strip(rest[:end + 1], "a/"), _strip(rest[end + 2:], "b/")
  if len(rest) % 2 == 1:
    half = (len(rest) - 1) // 2
    if rest[half] == " " and rest[2:half] == rest[half + 3:]:
      return _strip(rest[:half], "a/"), _strip(rest[half + 1:], "b/")
  parts = rest.split(" ")
  if len(parts) == 2:
    return _strip(parts[0], "a/"), _strip(parts[1], "b/")
  raise PatchError(f"cannot read the paths of `diff --git {rest}`")


def parse(diff: str) -> list[FileChange]:
  """The file sections of `diff`; raises `PatchError` naming the line for anything but a unified diff."""
  lines = split_lines(diff)
  changes: list[FileChange] = []
  i = 0

  def fail(why: str):
    raise PatchError(f"line {i + 1}: {why}: {lines[i].rstrip()[:80]!r}" if i < len(lines) else f"end: {why}")

  while i < len(lines):
    line = lines[i].rstrip("\n")
    if not line.strip():
      i += 1
      continue
    if line.startswith("diff --git "):
      old, new = _git_header_paths(line[len("diff --git "):])
      change = FileChange(old, new)
      i += 1
      created = deleted = False
      while i < len(lines) and lines[i].startswith(_EXTENDED):
        header = lines[i].rstrip("\n")
        if header.startswith(("old mode ", "new mode ", "deleted file mode ", "new file mode ")):
          change.modes += (header.rsplit(" ", 1)[1],)
        created |= header.startswith("new file mode ")
        deleted |= header.startswith("deleted file mode ")
        if header.startswith(("rename from ", "copy from ")):
          change.old_path = _unquote(header.split(" ", 2)[2])
        if header.startswith(("rename to ", "copy to ")):
          change.new_path = _unquote(header.split(" ", 2)[2])
        change.copy |= header.startswith("copy ")
        i += 1
      if created:
        change.old_path = None
      if deleted:
        change.new_path = None
      if i < len(lines) and (lines[i].startswith("Binary files ") or lines[i].startswith("GIT binary patch")):
        change.binary = True
        i += 1
        while i < len(lines) and not lines[i].startswith(("diff --git ", "--- ")):
          i += 1  # the binary payload: never decoded, never applied
        changes.append(change)
        continue
      if i < len(lines) and lines[i].startswith("--- "):
        i = _read_sections(lines, i, change, fail, from_git=True)
      changes.append(change)
      continue
    if line.startswith("--- "):
      change = FileChange(None, None)
      i = _read_sections(lines, i, change, fail, from_git=False)
      changes.append(change)
      continue
    fail("not part of a unified diff")
  return changes


def _read_sections(lines: list[str], i: int, change: FileChange, fail, from_git: bool) -> int:
  """Reads `--- a/x`, `+++ b/x` and the hunks after them into `change`; returns the next line index."""
  old = _strip(lines[i].rstrip("\n")[4:], "a/")
  if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
    fail("`---` without `+++`")
  new = _strip(lines[i + 1].rstrip("\n")[4:], "b/")
  if from_git:  # the `diff --git` and rename headers name the paths; `/dev/null` says created or deleted
    change.old_path = None if old is None else change.old_path
    change.new_path = None if new is None else change.new_path
  else:
    change.old_path, change.new_path = old, new
  i += 2
  if i >= len(lines) or not lines[i].startswith("@@"):
    fail("a file section without hunks")
  while i < len(lines) and lines[i].startswith("@@"):
    m = _HUNK_RE.match(lines[i])
    if not m:
      fail("malformed hunk header")
    old_count = 1 if m.group(2) is None else int(m.group(2))
    new_count = 1 if m.group(4) is None else int(m.group(4))
    hunk = Hunk(old_start=int(m.group(1)), old_lines=[], new_lines=[])
    i += 1
    seen_old = seen_new = 0
    while seen_old < old_count or seen_new < new_count:
      if i >= len(lines):
        fail("the hunk ends early")
      text, tag = lines[i][1:], lines[i][:1]
      if lines[i] in ("\n", "\r\n"):  # an empty context line whose leading space was lost (as `git apply` reads it)
        text, tag = lines[i], " "
      if tag == " ":
        hunk.old_lines.append(text)
        hunk.new_lines.append(text)
        seen_old, seen_new = seen_old + 1, seen_new + 1
      elif tag == "-":
        hunk.old_lines.append(text)
        seen_old += 1
      elif tag == "+":
        hunk.new_lines.append(text)
        seen_new += 1
      else:
        fail("not a hunk line")
      i += 1
      if i < len(lines) and lines[i].rstrip("\n") == _NO_NEWLINE:
        target = hunk.new_lines if tag == "+" else hunk.old_lines if tag == "-" else None
        for side in ([hunk.old_lines, hunk.new_lines] if target is None else [target]):
          side[-1] = side[-1].rstrip("\n")
        i += 1
    if seen_old != old_count or seen_new != new_count:
      fail("the hunk's line counts do not match its header")
    change.hunks.append(hunk)
  return i


def apply(change: FileChange, old: str | None) -> str | None:
  """The file's new content (None: deleted). Each hunk's context and removed lines must match exactly; a hunk may
  sit at another line than its header says (the nearest match wins), never with fuzz. Raises `PatchError`."""
  if change.special:
    raise PatchError(f"{change.paths[0]}: binary, symlink or submodule changes are not applied")
  if change.new_path is None:
    if old is None:
      raise PatchError(f"{change.old_path}: deletes a file that does not exist")
    if not change.hunks:
      return None
  lines = [] if old is None else split_lines(old)
  out, pos = [], 0
  for hunk in change.hunks:
    size = len(hunk.old_lines)
    want = max(hunk.old_start - 1, 0) if size else hunk.old_start  # an empty old side inserts *after* old_start
    found = None
    for delta in range(0, len(lines) + 1):
      for at in (want - delta, want + delta):
        if pos <= at <= len(lines) - size and lines[at:at + size] == hunk.old_lines:
          found = at
          break
      if found is not None:
        break
    if found is None:
      raise PatchError(f"{change.new_path or change.old_path}: a hunk at line {hunk.old_start} does not match")
    out += lines[pos:found] + hunk.new_lines
    pos = found + size
  out += lines[pos:]
  text = "".join(out)
  if change.new_path is None:
    if text:
      raise PatchError(f"{change.old_path}: the deletion does not remove the whole file")
    return None
  return text


def decode(data: bytes) -> str | None:
  """The text of a file, or None when it is binary (not UTF-8, or holding a NUL byte)."""
  if b"\0" in data:
    return None
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return None


def _quote(path: str) -> str:
  if re.search(r'[\x00-\x1f"\\\x7f]|\s$|^\s', path) or not path.isprintable():
    body = "".join(c if c.isprintable() and c not in '"\\' else
                   "".join(f"\\{b:03o}" for b in c.encode("utf-8", "surrogateescape")) for c in path)
    return f'"{body}"'
  return path


def format_file(path: str, old: bytes | None, new: bytes | None, symlink: bool = False) -> str:
  """A git-style section turning `old` into `new` at `path` (None: absent); "" when equal. Binary content (and a
  symlink, `symlink=True`) gets a header that names the change without its bytes: such changes are never applied."""
  if old == new and not symlink:
    return ""
  a, b = _quote("a/" + path), _quote("b/" + path)
  head = f"diff --git {a} {b}\n"
  if old is None:
    head += f"new file mode {SYMLINK_MODE if symlink else '100644'}\n"
  elif new is None:
    head += "deleted file mode 100644\n"
  old_text = "" if old is None else decode(old)
  new_text = "" if new is None else decode(new)
  if symlink or old_text is None or new_text is None:
    return head + f"Binary files {'/dev/null' if old is None else a} and {'/dev/null' if new is None else b} differ\n"
  body = []
  old_lines, new_lines = split_lines(old_text), split_lines(new_text)
  for group in difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_grouped_opcodes(3):
    i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
    body.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n")
    for tag, a1, a2, b1, b2 in group:
      for prefix, chunk in ((" ", old_lines[a1:a2]) if tag == "equal" else ("-", old_lines[a1:a2]),
                            ("+", new_lines[b1:b2]) if tag != "equal" else ("", [])):
        for line in chunk:
          body.append(prefix + line if line.endswith("\n") else f"{prefix}{line}\n{_NO_NEWLINE}\n")
  if not body:  # an empty file created or deleted
    return head
  return head + f"--- {'/dev/null' if old is None else a}\n+++ {'/dev/null' if new is None else b}\n" + "".join(body)


def _range(start: int, end: int) -> str:
  count = end - start
  return f"{start + 1 if count else start},{count}"
