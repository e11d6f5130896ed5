"""`sao.models.mesh_axes.logical_mesh_axes`, the one rule from logical axis names to mesh axes: directly on mesh
shapes (an axis the mesh lacks, an axis that does not divide the dim, an axis an earlier dim took), and through its
two users, `sharding.logical_to_spec` and `scan.shard_residual` (the specs they gave before the rule moved here)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from sao.models import scan, sharding
from sao.models.mesh_axes import BATCH_AXES, logical_mesh_axes

RULES = (("batch", BATCH_AXES), ("heads", ("tensor",)), ("mlp", ("tensor",)), ("embed", ("fsdp",)))


def test_drops_axes_the_mesh_lacks_and_axes_that_do_not_divide():
  no_fsdp = {"data": 2, "expert": 2, "tensor": 4}
  assert logical_mesh_axes(("batch", "embed"), (8, 6), no_fsdp, RULES) == (("data", "expert"), None)
  assert logical_mesh_axes(("batch", None), (6, 5), no_fsdp, RULES) == ("data", None)  # 2 × 2 does not divide 6
  assert logical_mesh_axes(("batch",), (3,), no_fsdp, RULES) == (None,)
  assert logical_mesh_axes(("heads", None), (6, 16), no_fsdp, RULES) == (None, None)  # tensor 4 does not divide 6
  assert logical_mesh_axes(("heads", None), (8, 16), no_fsdp, RULES) == ("tensor", None)
  assert logical_mesh_axes(("mlp", "heads"), (8, 8), no_fsdp, RULES) == ("tensor", None)  # taken by dim 0
  assert logical_mesh_axes((None, "embed"), (4, 4), {"fsdp": 2}, RULES) == (None, "fsdp")
  assert logical_mesh_axes((), (), {}, RULES) == ()


def test_errors_name_the_problem():
  with pytest.raises(ValueError, match="'nonsense': no entry"):
    logical_mesh_axes(("nonsense",), (4,), {"data": 2}, RULES)
  with pytest.raises(ValueError, match=r"\('batch',\) do not match shape \(4, 2\)"):
    logical_mesh_axes(("batch",), (4, 2), {"data": 2}, RULES)


def _mesh(**axes):
  return Mesh(np.array(jax.devices()[:8]).reshape(tuple(axes.values())), tuple(axes))


def test_logical_to_spec_is_the_rule_on_the_mesh_shape():
  mesh = _mesh(data=2, fsdp=2, tensor=2)
  cases = ((("batch", None), (8, 5)), (("batch", None), (2, 5)), (("heads", "head_dim"), (3, 16)),
           (("vocab", "embed"), (64, 16)), (("expert", "expert_mlp", "embed"), (4, 8, 16)))
  for names, shape in cases:
    spec = sharding.logical_to_spec(names, shape, mesh)
    assert spec == P(*logical_mesh_axes(names, shape, dict(mesh.shape), sharding.LOGICAL_AXIS_RULES))
  assert sharding.logical_to_spec(("expert", "expert_mlp", "embed"), (4, 8, 16), mesh) == P(None, "tensor", "fsdp")
  assert dict(scan.RESIDUAL_RULES)["batch"] == dict(sharding.LOGICAL_AXIS_RULES)["batch"]


def _constraint_spec(x, mesh) -> P | None:
  with jax.set_mesh(mesh):
    eqns = [e for e in jax.make_jaxpr(scan.shard_residual)(x).jaxpr.eqns if e.primitive.name == "sharding_constraint"]
  assert len(eqns) <= 1
  return eqns[0].params["sharding"].spec if eqns else None


@pytest.mark.parametrize("axes, shape, want", [
    (dict(data=2, fsdp=2, tensor=2), (4, 3, 8), P(("data", "fsdp"), None, "tensor")),
    (dict(data=2, fsdp=2, tensor=2), (2, 3, 8), P("data", None, "tensor")),  # 2 × 2 does not divide 2 rows
    (dict(data=2, fsdp=2, tensor=2), (3, 3, 8), P(None, None, "tensor")),
    (dict(data=1, fsdp=2, expert=1, tensor=4), (4, 3, 8), P("fsdp", None, "tensor")),  # size-1 axes left out
    (dict(fsdp=2, tensor=4), (2, 3, 6), None),  # tensor 4 does not divide E = 6: the identity
    (dict(fsdp=8, tensor=1), (8, 3, 8), None),
])
def test_shard_residual_specs(axes, shape, want):
  assert _constraint_spec(jnp.ones(shape), _mesh(**axes)) == want
