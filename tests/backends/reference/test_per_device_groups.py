"""The device groups of a collective whose replica groups name mesh axes (jax 0.12.1's
``#stablehlo.replica_group_mesh_axes``), against the groups written out by hand."""

import pytest

from ifrtpy.backends.reference import per_device
from ifrtpy.backends.reference.numpy_eval import Unsupported
from ifrtpy.program import mlir


def _meshes(text):
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy

    with mlir.context():
        return {"m": sdy.MeshAttr(ir.Attribute.parse(text))}


def _groups(axes, mesh='#sdy.mesh<["x"=2, "y"=3]>'):
    refs = ", ".join(f'#stablehlo.axis_ref<name = "{a}">' for a in axes)
    with mlir.context():
        return per_device._mesh_axes_groups(
            f"#stablehlo.replica_group_mesh_axes<mesh = @m, axes = [{refs}]>", _meshes(mesh))


@pytest.mark.parametrize("axes, expected", [
    (["x"], [[0, 3], [1, 4], [2, 5]]),             # devices (x, y) at x * 3 + y
    (["y"], [[0, 1, 2], [3, 4, 5]]),
    (["x", "y"], [[0, 1, 2, 3, 4, 5]]),
    (["y", "x"], [[0, 3, 1, 4, 2, 5]]),            # in the order the axes are named
])
def test_groups_of_mesh_axes(axes, expected):
    assert _groups(axes) == expected


def test_groups_follow_the_meshs_device_ids():
    assert _groups(["x"], '#sdy.mesh<["x"=2, "y"=2], device_ids=[3, 2, 1, 0]>') == [[3, 1], [2, 0]]


def test_unknown_mesh_or_axis_is_refused():
    with pytest.raises(Unsupported):
        with mlir.context():
            per_device._mesh_axes_groups(
                '#stablehlo.replica_group_mesh_axes<mesh = @other, axes = []>',
                _meshes('#sdy.mesh<["x"=2]>'))
    with pytest.raises(per_device.core.ProgramError):
        _groups(["z"])
