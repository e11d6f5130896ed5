"""The project's one list of device-mesh axes, in mesh order (no JAX import: experiment configs read it).

`data` (pure data parallel), `fsdp` (data parallel with sharded parameters and optimizer state), `expert` (the
stacked experts of MoE layers), `tensor` (heads and hidden units). The trainer's mesh (`sao.train.mesh.make_mesh`)
builds all four; an axis of size 1 costs nothing. `sao.models.sharding` maps logical axis names onto them.
"""
MESH_AXES = ("data", "fsdp", "expert", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")  # a data batch's rows, in this order (the `batch` sharding rule)
TENSOR_AXIS = "tensor"
