"""`sao.train.mesh_jit`: the learner's programs are recorded by name and shapes, and in serial mode (a multi-process
CPU job) a call returns only with its outputs computed."""
import jax
import jax.numpy as jnp
import numpy as np

from sao.train import mesh_jit, targets


def test_program_log_records_each_call_in_order_with_shapes():
  double = mesh_jit.program(lambda x: 2 * x)
  with mesh_jit.ProgramLog() as log:
    double(np.zeros((2, 3), np.float32))
    double(np.zeros((4,), np.int32))
  double(np.zeros(1))  # outside the block: not recorded
  assert [name for name, _ in log.calls] == ["<lambda>", "<lambda>"]
  assert log.calls[0][1] == "(2, 3):float32" and log.calls[1][1] == "(4,):int32"
  other = mesh_jit.ProgramLog()
  other.calls = list(log.calls)
  assert other.digest() == log.digest() and log.summary() == {"programs": 2, "digest": log.digest(),
                                                               "names": {"<lambda>": 2}}
  other.calls.pop()
  assert other.digest() != log.digest()


def test_update_programs_are_named_and_logged():
  batch = {"token_rewards": jnp.zeros((2, 4)), "action_mask": jnp.ones((2, 4), bool)}
  with mesh_jit.ProgramLog() as log:
    targets.monte_carlo_returns(batch, 1.0)
  assert log.calls[0][0] == "monte_carlo_returns"


def test_serial_mode_returns_computed_outputs():
  slow = mesh_jit.program(lambda x: jnp.linalg.matrix_power(x, 64))
  x = jnp.eye(256) * 0.5
  mesh_jit.serialize_executions(True)
  try:
    assert mesh_jit.executions_serialized()
    out = slow(x)
    assert out.is_ready()  # returned only once computed
  finally:
    mesh_jit.serialize_executions(False)
  np.testing.assert_allclose(np.asarray(slow(x))[0, 0], 0.5 ** 64, rtol=1e-5)


def test_cpu_mode_is_decided_from_the_backend_at_first_use():
  mesh_jit.serialize_executions("cpu")
  try:
    assert mesh_jit.executions_serialized() == (jax.default_backend() == "cpu")
  finally:
    mesh_jit.serialize_executions(False)
  try:
    mesh_jit.serialize_executions("yes")
    raise AssertionError("accepted a bad mode")
  except ValueError as e:
    assert "'yes'" in str(e)


def test_every_program_of_the_learner_is_a_mesh_jit():
  """Serial execution and the program log hold only for `MeshJit`s: no bare `jax.jit` in `sao.train`."""
  import os
  import re
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "sao", "train")
  bare = []
  for name in sorted(os.listdir(root)):
    if name.endswith(".py") and name != "mesh_jit.py":
      with open(os.path.join(root, name)) as f:
        for number, line in enumerate(f, 1):
          if re.search(r"\bjax\.jit\b|\bpjit\(", line.split("#")[0]) and not line.lstrip().startswith(("\"", "'")):
            bare.append(f"{name}:{number}: {line.strip()}")
  assert not bare, bare
