"""`str_replace_editor`: view / create / str_replace / insert, with OpenHands' (Anthropic's) semantics and messages.

The editor runs *inside* the episode's sandbox (`python -I -S -c <this file's source>`, the request as JSON on
stdin), not in the trainer's process: paths the agent names (symlinks included) then resolve in the sandbox's
mount namespace, so an edit can never reach a host file. This module therefore imports only the standard library,
and `main()` is its entry point there.

Semantics (as OpenHands' `str_replace_editor`):
  view         file: `cat -n` style (6-wide line numbers, a tab), optional `view_range` [start, end] (end -1 = to the
               end); directory: files up to 2 levels deep, hidden items excluded.
  create       writes `file_text` to a new file (parents created); refuses to overwrite an existing file.
  str_replace  replaces `old_str`, which must occur exactly once, by `new_str` (default: delete); shows a snippet.
  insert       inserts `new_str` after line `insert_line` (0 = at the top); shows a snippet.
Paths must be absolute. Errors come back as "ERROR: ..." observations, never exceptions; the exit code is 0 on
success and 1 on a tool error, so the caller can tell them apart.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

SNIPPET_LINES = 4
MAX_RESPONSE_LEN = 16000
TRUNCATED_MESSAGE = ("<response clipped><NOTE>To save on context only part of this file has been shown to you. You "
                     "should retry this tool after you have searched inside the file with `grep -n` in order to find "
                     "the line numbers of what you are looking for.</NOTE>")
COMMANDS = ("view", "create", "str_replace", "insert")


class ToolError(Exception):
  """A bad request: the message is the observation."""


def _maybe_truncate(text: str) -> str:
  return text if len(text) <= MAX_RESPONSE_LEN else text[:MAX_RESPONSE_LEN] + TRUNCATED_MESSAGE


def _numbered(text: str, descriptor: str, first_line: int = 1) -> str:
  text = _maybe_truncate(text.expandtabs())
  lines = "\n".join(f"{i + first_line:6}\t{line}" for i, line in enumerate(text.split("\n")))
  return f"Here's the result of running `cat -n` on {descriptor}:\n{lines}\n"


def _read(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except UnicodeDecodeError as e:
    raise ToolError(f"{path} is not a UTF-8 text file ({e.reason} at byte {e.start})") from None
  except OSError as e:
    raise ToolError(f"Ran into {e.strerror} while trying to read {path}") from None


def _write(path: str, text: str) -> None:
  try:
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
  except OSError as e:
    raise ToolError(f"Ran into {e.strerror} while trying to write to {path}") from None


def _validate(command: str, path: str) -> None:
  if not os.path.isabs(path):
    suggested = os.path.join(os.getcwd(), path)
    raise ToolError(f"The path {path} is not an absolute path, it should start with `/`. Maybe you meant "
                    f"{suggested}?")
  if command == "create":
    if os.path.exists(path):
      raise ToolError(f"File already exists at: {path}. Cannot overwrite files using command `create`.")
    return
  if not os.path.exists(path):
    raise ToolError(f"The path {path} does not exist. Please provide a valid path.")
  if os.path.isdir(path) and command != "view":
    raise ToolError(f"The path {path} is a directory and only the `view` command can be used on directories")


def view(path: str, view_range: list | None = None) -> str:
  if os.path.isdir(path):
    if view_range is not None:
      raise ToolError("The `view_range` parameter is not allowed when `path` points to a directory.")
    out = subprocess.run(["find", path, "-maxdepth", "2", "-not", "-path", "*/.*"], capture_output=True, text=True)
    if out.returncode != 0:
      raise ToolError(out.stderr.strip())
    listing = "\n".join(sorted(out.stdout.splitlines()))
    return (f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n"
            f"{_maybe_truncate(listing)}\n")
  text = _read(path)
  if view_range is None:
    return _numbered(text, path)
  if (not isinstance(view_range, list) or len(view_range) != 2
      or not all(isinstance(x, int) and not isinstance(x, bool) for x in view_range)):
    raise ToolError("Invalid `view_range`. It should be a list of two integers.")
  lines = text.split("\n")
  n = len(lines)
  start, end = view_range
  if start < 1 or start > n:
    raise ToolError(f"Invalid `view_range`: {view_range}. Its first element `{start}` should be within the range "
                    f"of lines of the file: {[1, n]}")
  if end != -1 and end > n:
    raise ToolError(f"Invalid `view_range`: {view_range}. Its second element `{end}` should be smaller than the "
                    f"number of lines in the file: `{n}`")
  if end != -1 and end < start:
    raise ToolError(f"Invalid `view_range`: {view_range}. Its second element `{end}` should be larger or equal "
                    f"than its first `{start}`")
  chosen = lines[start - 1:] if end == -1 else lines[start - 1:end]
  return _numbered("\n".join(chosen), path, start)


def create(path: str, file_text: str | None) -> str:
  if file_text is None:
    raise ToolError("Parameter `file_text` is required for command: create")
  parent = os.path.dirname(path)
  try:
    os.makedirs(parent, exist_ok=True)
  except OSError as e:
    raise ToolError(f"Ran into {e.strerror} while trying to create the directory {parent}") from None
  _write(path, file_text)
  return f"File created successfully at: {path}"


def str_replace(path: str, old_str: str | None, new_str: str | None) -> str:
  if old_str is None:
    raise ToolError("Parameter `old_str` is required for command: str_replace")
  text = _read(path).expandtabs()
  old_str = old_str.expandtabs()
  new_str = (new_str or "").expandtabs()
  count = text.count(old_str) if old_str else 0
  if count == 0:
    raise ToolError(f"No replacement was performed, old_str `{old_str}` did not appear verbatim in {path}.")
  if count > 1:
    starts, i = [], text.find(old_str)
    while i != -1:
      starts.append(text.count("\n", 0, i) + 1)
      i = text.find(old_str, i + 1)
    raise ToolError(f"No replacement was performed. Multiple occurrences of old_str `{old_str}` in lines {starts}. "
                    "Please ensure it is unique")
  new_text = text.replace(old_str, new_str)
  _write(path, new_text)
  line = text.split(old_str)[0].count("\n")
  first = max(0, line - SNIPPET_LINES)
  last = line + SNIPPET_LINES + new_str.count("\n")
  snippet = "\n".join(new_text.split("\n")[first:last + 1])
  return (f"The file {path} has been edited. " + _numbered(snippet, f"a snippet of {path}", first + 1)
          + "Review the changes and make sure they are as expected. Edit the file again if necessary.")


def insert(path: str, insert_line: int | None, new_str: str | None) -> str:
  if insert_line is None:
    raise ToolError("Parameter `insert_line` is required for command: insert")
  if new_str is None:
    raise ToolError("Parameter `new_str` is required for command: insert")
  lines = _read(path).expandtabs().split("\n")
  n = len(lines)
  if not isinstance(insert_line, int) or isinstance(insert_line, bool) or not 0 <= insert_line <= n:
    raise ToolError(f"Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines of the "
                    f"file: {[0, n]}")
  new_lines = new_str.expandtabs().split("\n")
  _write(path, "\n".join(lines[:insert_line] + new_lines + lines[insert_line:]))
  first = max(0, insert_line - SNIPPET_LINES)
  snippet = lines[first:insert_line] + new_lines + lines[insert_line:insert_line + SNIPPET_LINES]
  return ("The file " + path + " has been edited. " + _numbered("\n".join(snippet), "a snippet of the edited file",
                                                               first + 1)
          + "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). "
          "Edit the file again if necessary.")


def execute(request: dict) -> str:
  """Runs one editor request (the tool call's arguments); raises `ToolError` with the observation on bad input."""
  command, path = request.get("command"), request.get("path")
  if command not in COMMANDS:
    raise ToolError(f"Unrecognized command {command!r}. The allowed commands for the str_replace_editor tool are: "
                    + ", ".join(f"`{c}`" for c in COMMANDS))
  if not isinstance(path, str) or not path:
    raise ToolError("Parameter `path` is required")
  _validate(command, path)
  if command == "view":
    return view(path, request.get("view_range"))
  if command == "create":
    return create(path, request.get("file_text"))
  if command == "str_replace":
    return str_replace(path, request.get("old_str"), request.get("new_str"))
  return insert(path, request.get("insert_line"), request.get("new_str"))


def main() -> int:
  try:
    print(execute(json.loads(sys.stdin.read())), end="")
    return 0
  except ToolError as e:
    print(f"ERROR:\n{e}", end="")
    return 1


if __name__ == "__main__":
  sys.exit(main())
