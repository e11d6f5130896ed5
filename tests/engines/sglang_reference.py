"""SGLang's own definitions of its HTTP API, read from the pinned `sglang` wheel (never installed, never imported
as a package): the reference `tests/engines/test_sglang_contract.py` checks the client and the local engine against.

The wheel (`SGLANG_WHEEL`, checked by its sha256) is fetched once with `pip download --no-deps` into
`$SAO_SGLANG_WHEEL_DIR` (default `~/.cache/sao/sglang-wheel`; a file already there with the right hash is used as
is). Installing it is not an option on CPU machines: `sglang` pins a CUDA torch and GPU kernels, and importing
`sglang.*` runs the package's `__init__`, which pulls torch, triton, torchvision and transformers' image stack. So:

- `sglang/api/v1/api_types.py` (generated from SGLang's proto schema; its only dependency is `msgspec`) is loaded
  in isolation, as a module of its own. It is the code SGLang's server runs on every `/generate` body
  (`sglang.srt.entrypoints.api_contract.generate_contract_error` calls `GenerateRequest.from_json_value`), and it
  defines the response shapes (`GenerateResponse`, `GenerateMetaInfo`, `LogprobEntry`, `GetModelInfoResponse`).
- `SamplingParams` of `sglang/srt/sampling/sampling_params.py` (the class whose `verify` refuses out-of-range
  values) runs from the wheel's source, its one import of another sglang module replaced by stand-ins.
- The rest is parsed with `ast`, not run: the fields of `GenerateReqInput`, `UpdateWeightFromDiskReqInput` and
  `UpdateWeightFromDiskReqOutput` (`sglang/srt/managers/io_struct.py`), the HTTP routes (decorators of
  `sglang/srt/entrypoints/http_server.py`) and the keys the server writes into a response's `meta_info`
  (`sglang/srt/managers/tokenizer_manager.py`).

Any failure to get or read the wheel raises `SGLangReferenceError` with what to do: the contract tests fail, they
never skip.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import os
import subprocess
import sys
import types
import typing
import zipfile
from typing import Any

SGLANG_VERSION = "0.5.23"
SGLANG_WHEEL = "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
SGLANG_WHEEL_SHA256 = "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
# The wheel is platform-tagged; these flags make `pip download` pick exactly that file on any machine.
_PIP_PLATFORM_FLAGS = ("--only-binary=:all:", "--platform", "manylinux_2_34_x86_64", "--python-version", "3.11",
                       "--implementation", "cp", "--abi", "cp311")

API_TYPES = "sglang/api/v1/api_types.py"
IO_STRUCT = "sglang/srt/managers/io_struct.py"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
TOKENIZER_MANAGER = "sglang/srt/managers/tokenizer_manager.py"
SAMPLING_PARAMS = "sglang/srt/sampling/sampling_params.py"


class SGLangReferenceError(RuntimeError):
  """The pinned SGLang wheel could not be had or read."""


def wheel_dir() -> str:
  return os.environ.get("SAO_SGLANG_WHEEL_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "sao",
                                                                 "sglang-wheel")


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def fetch_wheel() -> str:
  """The path of the pinned wheel, downloaded first if the cache lacks it; raises `SGLangReferenceError`."""
  import filelock  # a runtime dependency (sao.engines.compilation_cache); keeps two pytest workers from racing

  directory = wheel_dir()
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, SGLANG_WHEEL)
  with filelock.FileLock(path + ".lock", timeout=900):
    if not (os.path.exists(path) and _sha256(path) == SGLANG_WHEEL_SHA256):
      if os.path.exists(path):  # pip would keep a file of that name ("already downloaded")
        os.remove(path)
      cmd = [sys.executable, "-m", "pip", "download", f"sglang=={SGLANG_VERSION}", "--no-deps", *_PIP_PLATFORM_FLAGS,
             "--dest", directory]
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
      if proc.returncode != 0 or not os.path.exists(path):
        raise SGLangReferenceError(
            f"could not download {SGLANG_WHEEL} (the SGLang code the engine contract is tested against) with "
            f"`{' '.join(cmd)}` (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-1500:]}\nPut that file in "
            f"{directory} (or point $SAO_SGLANG_WHEEL_DIR at a directory holding it).")
    actual = _sha256(path)
    if actual != SGLANG_WHEEL_SHA256:
      raise SGLangReferenceError(f"{path}: sha256 {actual}, expected {SGLANG_WHEEL_SHA256} (a different build of "
                                 f"sglang {SGLANG_VERSION}?); delete it to download the pinned one")
  return path


def read_source(wheel: str, member: str) -> str:
  try:
    with zipfile.ZipFile(wheel) as z:
      return z.read(member).decode("utf-8")
  except KeyError as e:
    raise SGLangReferenceError(f"{wheel} has no {member}") from e


def load_api_types(wheel: str) -> types.ModuleType:
  """`sglang/api/v1/api_types.py` of the wheel as a standalone module (needs only msgspec)."""
  try:
    import msgspec  # noqa: F401  (the test extra installs it; say so rather than fail deep inside the module)
  except ImportError as e:
    raise SGLangReferenceError("msgspec is required to load SGLang's api_types (pip install -e '.[test]')") from e
  name = "sglang_reference_api_types_" + SGLANG_VERSION.replace(".", "_")
  if name in sys.modules:
    return sys.modules[name]
  module = types.ModuleType(name)
  module.__file__ = f"{wheel}/{API_TYPES}"
  sys.modules[name] = module  # before exec: msgspec resolves the Structs' string annotations through it
  try:
    exec(compile(read_source(wheel, API_TYPES), module.__file__, "exec"), module.__dict__)
  except BaseException:
    del sys.modules[name]
    raise
  return module


# ---- ast extracts ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Field:
  annotation: str  # the annotation's source text, e.g. "Optional[Union[List[List[int]], List[int]]]"
  required: bool  # no default


def class_fields(source: str, class_name: str) -> dict[str, Field]:
  """The annotated fields of `class_name` in `source`, those of its bases defined in the same module first (a
  msgspec Struct or dataclass: `name: annotation [= default]`)."""
  classes = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
  if class_name not in classes:
    raise SGLangReferenceError(f"class {class_name} not found")
  node = classes[class_name]
  fields: dict[str, Field] = {}
  for base in node.bases:
    if isinstance(base, ast.Name) and base.id in classes:
      fields.update(class_fields(source, base.id))
  for stmt in node.body:
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
      fields[stmt.target.id] = Field(ast.unparse(stmt.annotation), stmt.value is None)
  return fields


def routes(source: str) -> set[tuple[str, str]]:
  """(method, path) of every `@app.get/post/put/delete/api_route("path", methods=[...])` with a literal path."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    for dec in node.decorator_list:
      if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
              and isinstance(dec.func.value, ast.Name) and dec.func.value.id == "app" and dec.args
              and isinstance(dec.args[0], ast.Constant) and isinstance(dec.args[0].value, str)):
        continue
      kind, path = dec.func.attr, dec.args[0].value
      if kind == "api_route":
        methods = [kw.value for kw in dec.keywords if kw.arg == "methods"]
        names = [e.value for e in methods[0].elts] if methods else ["GET"]
      else:
        names = [kind.upper()]
      found.update((m, path) for m in names)
  return found


def meta_info_keys(source: str) -> set[str]:
  """The literal keys written into a variable named `meta_info`: `meta_info = {...}`, `meta_info["k"] = ...` and
  `meta_info.update({...})`."""
  keys: set[str] = set()

  def literal_keys(d: ast.AST) -> None:
    if isinstance(d, ast.Dict):
      keys.update(k.value for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))

  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Assign):
      for target in node.targets:
        if isinstance(target, ast.Name) and target.id == "meta_info":
          literal_keys(node.value)
        elif (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
              and target.value.id == "meta_info" and isinstance(target.slice, ast.Constant)):
          keys.add(target.slice.value)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
          and isinstance(node.func.value, ast.Name) and node.func.value.id == "meta_info" and node.args):
      literal_keys(node.args[0])
  return keys


# ---- JSON values against annotations --------------------------------------------------------------------------

class _OpaqueMeta(type):
  def __getitem__(cls, item: Any) -> type:  # `SomeSGLangGeneric[...]` stays opaque
    return cls


class _Opaque(metaclass=_OpaqueMeta):
  """Stands for a name the annotation uses that is not a builtin or `typing` name (an SGLang type or validator,
  e.g. `PlainValidator(...)`): matches any value."""

  def __new__(cls, *args: Any, **kwargs: Any) -> Any:
    return cls


def _resolve(annotation: str) -> Any:
  namespace: dict[str, Any] = {name: getattr(typing, name) for name in typing.__all__}
  namespace.update(int=int, float=float, str=str, bool=bool, bytes=bytes, list=list, dict=dict, tuple=tuple)
  tree = ast.parse(annotation, mode="eval")
  for node in ast.walk(tree):
    if isinstance(node, ast.Name) and node.id not in namespace:
      namespace[node.id] = _Opaque
  return eval(compile(tree, "<annotation>", "eval"), namespace)  # noqa: S307 — the wheel's own annotation text


def matches(value: Any, annotation: str | Any) -> bool:
  """Whether a JSON value fits a type annotation (its source text or the resolved type). ints are not bools; a
  float annotation takes ints (JSON has one number type)."""
  tp = _resolve(annotation) if isinstance(annotation, str) else annotation
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if tp is Any or tp is _Opaque:
    return True
  if tp is type(None):
    return value is None
  if origin is typing.Annotated:
    return matches(value, args[0])
  if origin is typing.Union:
    return any(matches(value, a) for a in args)
  if origin is typing.Literal:
    return value in args
  if origin in (list, set, frozenset, typing.Sequence):
    return isinstance(value, list) and all(matches(v, args[0]) for v in value) if args else isinstance(value, list)
  if origin is dict:
    return isinstance(value, dict) and (not args or all(matches(k, args[0]) and matches(v, args[1])
                                                        for k, v in value.items()))
  if tp in (list, dict):
    return isinstance(value, tp)
  if tp is bool:
    return isinstance(value, bool)
  if tp is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if tp is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if tp is str:
    return isinstance(value, str)
  raise SGLangReferenceError(f"annotation {annotation!r}: no JSON rule for {tp!r}")


def load_sampling_params_class(wheel: str) -> type:
  """`SamplingParams` of `sglang/srt/sampling/sampling_params.py`, the class SGLang's tokenizer manager builds from
  each request's `sampling_params` (then `normalize(tokenizer)`, `verify(vocab_size)`), run from the wheel's source.
  Its one import of another sglang module (the watermark config) is replaced by stand-ins that refuse a watermark:
  the requests checked here never carry one."""
  tree = ast.parse(read_source(wheel, SAMPLING_PARAMS))
  tree.body = [node for node in tree.body
               if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"))]

  def normalize_watermark_request(watermark: Any) -> Any:
    if watermark is not None:
      raise SGLangReferenceError("a watermark is outside what the stand-in of SGLang's watermark module covers")
    return None

  name = "sglang_reference_sampling_params_" + SGLANG_VERSION.replace(".", "_")
  module = types.ModuleType(name)
  module.__dict__.update(WatermarkRequestConfig=_Opaque, normalize_watermark_request=normalize_watermark_request)
  module.__file__ = f"{wheel}/{SAMPLING_PARAMS}"
  sys.modules[name] = module  # msgspec resolves the Struct's annotations through it
  exec(compile(tree, module.__file__, "exec"), module.__dict__)
  return module.SamplingParams


@dataclasses.dataclass(frozen=True)
class SGLangReference:
  """What the contract tests read from the wheel."""
  api: types.ModuleType  # sglang/api/v1/api_types.py
  generate_req_input: dict[str, Field]
  update_weights_req_input: dict[str, Field]
  update_weights_req_output: dict[str, Field]
  routes: set[tuple[str, str]]
  meta_info_keys: set[str]
  sampling_params_class: type  # sglang/srt/sampling/sampling_params.py's SamplingParams

  def sampling_params_error(self, params: dict, vocab_size: int) -> str | None:
    """What SGLang refuses in one `sampling_params` object (the tokenizer manager's `SamplingParams(**params)`,
    `normalize`, `verify(vocab_size)`: a 400), or None."""
    try:
      sp = self.sampling_params_class(**params)
      sp.normalize(None)
      sp.verify(vocab_size)
    except (TypeError, ValueError) as e:
      return f"{type(e).__name__}: {e}"
    return None

  def generate_contract_error(self, body: Any) -> str | None:
    """What SGLang's `/generate` answers 400 to (`sglang.srt.entrypoints.api_contract.generate_contract_error`)."""
    try:
      self.api.GenerateRequest.from_json_value(body)
    except self.api.JsonContractError as e:
      return str(e)
    return None


def load_reference() -> SGLangReference:
  wheel = fetch_wheel()
  io_struct = read_source(wheel, IO_STRUCT)
  return SGLangReference(
      api=load_api_types(wheel),
      generate_req_input=class_fields(io_struct, "GenerateReqInput"),
      update_weights_req_input=class_fields(io_struct, "UpdateWeightFromDiskReqInput"),
      update_weights_req_output=class_fields(io_struct, "UpdateWeightFromDiskReqOutput"),
      routes=routes(read_source(wheel, HTTP_SERVER)),
      meta_info_keys=meta_info_keys(read_source(wheel, TOKENIZER_MANAGER)),
      sampling_params_class=load_sampling_params_class(wheel))
