"""The device mesh puts tensor parallelism across nodes and data parallelism inside."""

import dataclasses

from distdoctor.faults import Fault, Variant


def _two_nodes(spec):
    """Two ranks per node, and a batch big enough that a tensor-parallel all-reduce (batch
    x hidden) outweighs the data-parallel gradient average, as it does in real models."""
    return dataclasses.replace(spec, ranks_per_node=2, batch_size=32, num_samples=128)


FAULT = Fault(
    id="tp-across-nodes",
    title="Tensor parallelism over the slow link",
    strategies=("tp-dp",),
    symptom="every tensor-parallel all-reduce (one per row-parallel layer and micro-batch "
            "in the forward, and one in the backward for every block above the first) "
            "crosses between nodes, while the once-a-step gradient average stays inside one",
    cause="the device mesh's dimensions are swapped: tensor-parallel groups take one rank "
          "from each node (ranks fill nodes in order, LOCAL_WORLD_SIZE at a time) and the "
          "data-parallel groups the ranks of one node",
    fix="make tensor parallelism the mesh's inner dimension, init_device_mesh(device, "
        "(dp, tp), mesh_dim_names=('dp', 'tp')), so each tensor-parallel group is ranks of "
        "one node",
    variants=(Variant("swapped-mesh", "the mesh is (tp, dp): each tensor-parallel group "
                      "spans the nodes", {"knobs.tp_inside_node": False}),),
    scenario=_two_nodes,
    reported_as=("tp-across-nodes",),
    min_world_size=4,
)
