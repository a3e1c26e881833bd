"""Manual SPMD regions (``sdy.manual_computation``) and the collectives of their bodies:
the reference backend runs each body once per device, and it and the PjRt backend agree
with NumPy, which computes every device's value by hand here.

Each program takes an 8x8 array over a 4x2 mesh (axes ``x`` and ``y``): device (i, j),
of id ``2 * i + j`` unless the mesh names its ids, holds rows 2i..2i+1 and columns
4j..4j+3 in the body, a 2x4 local value. The oracle gathers what each device computes
and assembles the result as the out sharding says.
"""

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.errors import IfrtError

X, Y = 4, 2
IDS = list(range(8))


@pytest.fixture(scope="module", params=["reference", "pjrt"])
def client(request):
    return ifrt.get_client(request.param, device_count=8)


def _program(body: str, results: list[tuple[str, str, str]], *, element: str = "f32",
             ids: list[int] | None = None, manual: str = '"x", "y"',
             in_sharding: str = '[{"x"}, {"y"}]', local: str = "2x4") -> str:
    """A module whose main runs ``body`` (lines using ``%l``, the local value, ending
    in ``sdy.return``) in a manual computation; ``results``: (global type, local type,
    out sharding) of each result."""
    device_ids = f", device_ids=[{', '.join(map(str, ids))}]" if ids is not None else ""
    globals_ = ", ".join(g for g, _, _ in results)
    outs = ", ".join(f"<@mesh, {s}>" for _, _, s in results)
    return f"""
module @manual attributes {{mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32}} {{
  sdy.mesh @mesh = <["x"=4, "y"=2]{device_ids}>
  func.func public @main(%arg0: tensor<8x8x{element}>) -> ({globals_}) {{
    %0:{len(results)} = sdy.manual_computation(%arg0) in_shardings=[<@mesh, {in_sharding}>] out_shardings=[{outs}] manual_axes={{{manual}}} (%l: tensor<{local}x{element}>) {{
{body}
    }} : (tensor<8x8x{element}>) -> ({globals_})
    return {", ".join(f"%0#{i}" for i in range(len(results)))} : {globals_}
  }}
}}
""".replace("%0:1 ", "%0 ").replace("%0#0 :", "%0 :")


def _run(client, text: str, x: np.ndarray) -> list[np.ndarray]:
    devices = client.make_device_list(client.addressable_devices())
    executable = client.compile(text, ifrt.CompileOptions(devices=devices, num_partitions=8))
    sharding = executable.parameter_shardings()[0]
    arg = client.make_array_from_host_buffer(x, sharding)
    result = executable.execute([arg], ifrt.ExecuteOptions(fill_status=True))
    result.status.result(timeout=120)
    return [np.asarray(out) for out in result.outputs]


def _locals(x: np.ndarray, ids=IDS) -> dict[int, np.ndarray]:
    """Each device id's local value: mesh position (i, j) holds its tile."""
    return {ids[i * Y + j]: x[2 * i:2 * i + 2, 4 * j:4 * j + 4] for i in range(X) for j in range(Y)}


def _assemble(values: dict[int, np.ndarray], ids=IDS) -> np.ndarray:
    """The global value of per-device values sharded [{"x"}, {"y"}]."""
    return np.block([[values[ids[i * Y + j]] for j in range(Y)] for i in range(X)])


def _arange(dtype=np.float32) -> np.ndarray:
    return np.arange(64).astype(dtype).reshape(8, 8)


X_GROUPS = "dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>"
Y_GROUPS = "dense<[[0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi64>"
CHANNEL = "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>"
LOCAL = "tensor<2x4xf32>"
TILED = '[{"x"}, {"y"}]'


def _reduce_body(op: str, groups: str, attrs: str, result: str = LOCAL, element: str = "f32",
                 extra: str = "", computation: str = "add") -> str:
    return f"""      %r = "stablehlo.{op}"(%l) <{{{attrs}replica_groups = {groups}{extra}}}> ({{
      ^bb0(%a: tensor<{element}>, %b: tensor<{element}>):
        %s = stablehlo.{computation} %a, %b : tensor<{element}>
        stablehlo.return %s : tensor<{element}>
      }}) : (tensor<2x4x{element}>) -> {result}
      sdy.return %r : {result}"""


def _by_groups(local: dict, groups: list[list[int]], combine) -> dict:
    out = {}
    for group in groups:
        value = combine([local[d] for d in group])
        for d in group:
            out[d] = value
    return out


def test_all_reduce_over_one_axis(client):
    x = _arange()
    text = _program(_reduce_body("all_reduce", X_GROUPS, f"{CHANNEL}, ", extra=", use_global_device_ids"),
                    [("tensor<8x8xf32>", LOCAL, TILED)])
    local = _locals(x)
    expected = _assemble(_by_groups(local, [[0, 2, 4, 6], [1, 3, 5, 7]], lambda vs: sum(vs)))
    np.testing.assert_array_equal(_run(client, text, x)[0], expected)


def test_all_reduce_maximum_of_integers_replicated_over_the_reduced_axis(client):
    x = (_arange(np.int32) * 37) % 23 - 11
    text = _program(_reduce_body("all_reduce", X_GROUPS, f"{CHANNEL}, ", "tensor<2x4xi32>", "i32",
                                 ", use_global_device_ids", "maximum"),
                    [("tensor<2x8xi32>", "tensor<2x4xi32>", '[{}, {"y"}]')], element="i32")
    expected = np.maximum.reduce([x[2 * i:2 * i + 2] for i in range(X)])
    np.testing.assert_array_equal(_run(client, text, x)[0], expected)


def test_all_reduce_with_a_channel_and_replica_ids_spans_every_partition(client):
    x = _arange()
    text = _program(_reduce_body("all_reduce", "dense<[[0]]> : tensor<1x1xi64>", f"{CHANNEL}, "),
                    [("tensor<2x4xf32>", LOCAL, "[{}, {}]")])
    expected = sum(_locals(x).values())
    np.testing.assert_array_equal(_run(client, text, x)[0], expected)


def test_all_reduce_without_a_channel_leaves_each_partition_alone(client):
    x = _arange()
    text = _program(_reduce_body("all_reduce", "dense<[[0]]> : tensor<1x1xi64>", ""),
                    [("tensor<8x8xf32>", LOCAL, TILED)])
    np.testing.assert_array_equal(_run(client, text, x)[0], x)


def test_reduce_scatter(client):
    x = _arange()
    body = _reduce_body("reduce_scatter", X_GROUPS, f"{CHANNEL}, ", "tensor<2x1xf32>",
                        extra=", scatter_dimension = 1 : i64, use_global_device_ids")
    text = _program(body, [("tensor<8x2xf32>", "tensor<2x1xf32>", TILED)])
    local = _locals(x)
    out = {}
    for group in ([0, 2, 4, 6], [1, 3, 5, 7]):
        total = sum(local[d] for d in group)
        for k, d in enumerate(group):
            out[d] = total[:, k:k + 1]
    np.testing.assert_array_equal(_run(client, text, x)[0], _assemble(out))


def test_all_gather(client):
    x = _arange()
    body = f"""      %r = "stablehlo.all_gather"(%l) <{{all_gather_dim = 0 : i64, {CHANNEL}, replica_groups = {Y_GROUPS}, use_global_device_ids}}> : ({LOCAL}) -> tensor<4x4xf32>
      sdy.return %r : tensor<4x4xf32>"""
    text = _program(body, [("tensor<16x8xf32>", "tensor<4x4xf32>", TILED)])
    local = _locals(x)
    gathered = _by_groups(local, [[2 * i, 2 * i + 1] for i in range(X)], np.concatenate)
    np.testing.assert_array_equal(_run(client, text, x)[0], _assemble(gathered))


def test_all_to_all(client):
    x = _arange()
    body = f"""      %r = "stablehlo.all_to_all"(%l) <{{{CHANNEL}, concat_dimension = 0 : i64, replica_groups = {X_GROUPS}, split_count = 4 : i64, split_dimension = 1 : i64}}> : ({LOCAL}) -> tensor<8x1xf32>
      sdy.return %r : tensor<8x1xf32>"""
    text = _program(body, [("tensor<32x2xf32>", "tensor<8x1xf32>", TILED)])
    local = _locals(x)
    out = {}
    for group in ([0, 2, 4, 6], [1, 3, 5, 7]):
        for k, d in enumerate(group):
            out[d] = np.concatenate([local[s][:, k:k + 1] for s in group], axis=0)
    np.testing.assert_array_equal(_run(client, text, x)[0], _assemble(out))


def test_collective_permute_gives_zeros_where_nothing_arrives(client):
    x = _arange()
    pairs = [(0, 2), (2, 4), (4, 6), (1, 3)]
    flat = ", ".join(f"[{s}, {t}]" for s, t in pairs)
    body = f"""      %r = "stablehlo.collective_permute"(%l) <{{{CHANNEL}, source_target_pairs = dense<[{flat}]> : tensor<{len(pairs)}x2xi64>}}> : ({LOCAL}) -> {LOCAL}
      sdy.return %r : {LOCAL}"""
    text = _program(body, [("tensor<8x8xf32>", LOCAL, TILED)])
    local = _locals(x)
    sources = {t: s for s, t in pairs}
    out = {d: local[sources[d]] if d in sources else np.zeros_like(local[d]) for d in local}
    np.testing.assert_array_equal(_run(client, text, x)[0], _assemble(out))


def test_partition_id_and_replica_id_over_a_mesh_of_permuted_ids(client):
    ids = [3, 6, 0, 1, 7, 2, 5, 4]
    body = """      %p = stablehlo.partition_id : tensor<ui32>
      %q = stablehlo.replica_id : tensor<ui32>
      %s = stablehlo.add %p, %q : tensor<ui32>
      %b = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<ui32>) -> tensor<1x1xui32>
      sdy.return %b : tensor<1x1xui32>"""
    text = _program(body, [("tensor<4x2xui32>", "tensor<1x1xui32>", TILED)], ids=ids)
    expected = np.array(ids, np.uint32).reshape(4, 2)
    np.testing.assert_array_equal(_run(client, text, _arange())[0], expected)


def test_collective_permute_in_a_loop_and_a_called_function(client):
    """A ring shift three times (a while loop around a call): each device ends with the
    value of the device three before it along x."""
    x = _arange()
    pairs = ", ".join(f"[{2 * i + j}, {2 * ((i + 1) % X) + j}]" for i in range(X) for j in range(Y))
    text = _program(f"""      %c0 = stablehlo.constant dense<0> : tensor<i32>
      %r:2 = stablehlo.while(%i = %c0, %v = %l) : tensor<i32>, {LOCAL}
      cond {{
        %c3 = stablehlo.constant dense<3> : tensor<i32>
        %lt = stablehlo.compare LT, %i, %c3 : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %lt : tensor<i1>
      }} do {{
        %c1 = stablehlo.constant dense<1> : tensor<i32>
        %n = stablehlo.add %i, %c1 : tensor<i32>
        %w = func.call @shift(%v) : ({LOCAL}) -> {LOCAL}
        stablehlo.return %n, %w : tensor<i32>, {LOCAL}
      }}
      sdy.return %r#1 : {LOCAL}""", [("tensor<8x8xf32>", LOCAL, TILED)])
    text = text.rstrip()[:-1] + f"""
  func.func private @shift(%v: {LOCAL}) -> {LOCAL} {{
    %s = "stablehlo.collective_permute"(%v) <{{{CHANNEL}, source_target_pairs = dense<[{pairs}]> : tensor<8x2xi64>}}> : ({LOCAL}) -> {LOCAL}
    return %s : {LOCAL}
  }}
}}
"""
    expected = np.roll(x, 6, axis=0)
    np.testing.assert_array_equal(_run(client, text, x)[0], expected)


def test_a_manual_axis_and_a_free_one(client):
    """Manual over x only: the body sees columns whole (y is free), and sums over x."""
    x = _arange()
    body = _reduce_body("all_reduce", X_GROUPS, f"{CHANNEL}, ", "tensor<2x8xf32>",
                        extra=", use_global_device_ids").replace("tensor<2x4xf32>", "tensor<2x8xf32>")
    text = _program(body, [("tensor<2x8xf32>", "tensor<2x8xf32>", "[{}, {}]")],
                    manual='"x"', in_sharding='[{"x"}, {}]', local="2x8")
    expected = sum(x[2 * i:2 * i + 2] for i in range(X))
    np.testing.assert_array_equal(_run(client, text, x)[0], expected)


def test_devices_that_reach_different_collectives_fail_on_reference():
    """XLA would wait forever (so PjRt is not run): the reference backend fails the
    execute naming the divergence."""
    client = ifrt.get_client("reference", device_count=8)
    body = f"""      %p = stablehlo.partition_id : tensor<ui32>
      %c = stablehlo.constant dense<0> : tensor<ui32>
      %z = stablehlo.compare EQ, %p, %c : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
      %r = "stablehlo.if"(%z) ({{
        %s = "stablehlo.collective_permute"(%l) <{{{CHANNEL}, source_target_pairs = dense<[[0, 1]]> : tensor<1x2xi64>}}> : ({LOCAL}) -> {LOCAL}
        stablehlo.return %s : {LOCAL}
      }}, {{
        stablehlo.return %l : {LOCAL}
      }}) : (tensor<i1>) -> {LOCAL}
      sdy.return %r : {LOCAL}"""
    text = _program(body, [("tensor<8x8xf32>", LOCAL, TILED)])
    with pytest.raises(IfrtError, match="collective"):
        _run(client, text, _arange())


UNREDUCED_DOT = """
module @unreduced attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=2]>
  func.func public @main(%a: tensor<2x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"x"}]>}, %b: tensor<2x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) -> (tensor<2x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}], unreduced={"x"}>}) {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %1 = sdy.sharding_constraint %0 <@mesh, [{}, {}], unreduced={"x"}> : tensor<2x2xf32>
    return %1 : tensor<2x2xf32>
  }
}
"""
REDUCE = """
module @reduce attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=2]>
  func.func public @main(%a: tensor<2x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}], unreduced={"x"}>}) -> (tensor<2x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}) {
    %0 = sdy.sharding_constraint %a <@mesh, [{}, {}]> : tensor<2x2xf32>
    return %0 : tensor<2x2xf32>
  }
}
"""


def test_unreduced_results_hold_partial_values_and_reduce_as_arguments(client):
    """A dot left unreduced over its contracted axis: each device holds a partial value,
    the two sum to the product, and a program taking it as an argument reduces it."""
    devices = client.make_device_list(client.addressable_devices()[:2])
    options = ifrt.CompileOptions(devices=devices, num_partitions=2)
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    dot = client.compile(UNREDUCED_DOT, options)
    args = [client.make_array_from_host_buffer(a, s) for s in dot.parameter_shardings()]
    out, = dot.execute(args, ifrt.ExecuteOptions()).outputs
    sharding = out.sharding
    assert sharding.has_unreduced_axes and sharding.reduction == "sum"
    assert [sorted(d.id for d in g) for g in sharding.unreduced_groups()] == [
        [d.id for d in devices]]
    partial = [np.asarray(s) for s in out.disassemble_into_single_device_arrays()]
    np.testing.assert_array_equal(partial[0] + partial[1], a @ a)
    reduce = client.compile(REDUCE, options)
    total, = reduce.execute([out], ifrt.ExecuteOptions()).outputs
    np.testing.assert_array_equal(np.asarray(total), a @ a)


def test_a_result_unreduced_over_a_manual_axis_is_the_sum_of_the_devices_values(client):
    x = _arange()
    text = _program("      sdy.return %l : tensor<2x4xf32>",
                    [("tensor<2x8xf32>", LOCAL, '[{}, {"y"}], unreduced={"x"}')])
    text = text.replace("-> (tensor<2x8xf32>)", "-> (tensor<2x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>})", 1)
    expected = sum(x[2 * i:2 * i + 2] for i in range(X))
    np.testing.assert_array_equal(_run(client, text, x)[0], expected)


NESTED = f"""
module @nested attributes {{mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32}} {{
  sdy.mesh @mesh = <["x"=4, "y"=2]>
  func.func public @main(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {{
    %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{{"x"}}, {{}}]>] out_shardings=[<@mesh, [{{"x"}}, {{}}]>] manual_axes={{"x"}} (%rows: tensor<2x8xf32>) {{
      %1 = sdy.manual_computation(%rows) in_shardings=[<@mesh, [{{}}, {{"y"}}]>] out_shardings=[<@mesh, [{{}}, {{"y"}}]>] manual_axes={{"y"}} (%l: tensor<2x4xf32>) {{
        %r = "stablehlo.all_reduce"(%l) <{{{CHANNEL}, replica_groups = {Y_GROUPS}, use_global_device_ids}}> ({{
        ^bb0(%a: tensor<f32>, %b: tensor<f32>):
          %s = stablehlo.add %a, %b : tensor<f32>
          stablehlo.return %s : tensor<f32>
        }}) : (tensor<2x4xf32>) -> tensor<2x4xf32>
        %p = stablehlo.partition_id : tensor<ui32>
        %f = stablehlo.convert %p : (tensor<ui32>) -> tensor<f32>
        %b = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
        %t = stablehlo.add %r, %b : tensor<2x4xf32>
        sdy.return %t : tensor<2x4xf32>
      }} : (tensor<2x8xf32>) -> tensor<2x8xf32>
      %one = stablehlo.constant dense<1.0> : tensor<2x8xf32>
      %2 = stablehlo.add %1, %one : tensor<2x8xf32>
      sdy.return %2 : tensor<2x8xf32>
    }} : (tensor<8x8xf32>) -> tensor<8x8xf32>
    return %0 : tensor<8x8xf32>
  }}
}}
"""


def test_a_manual_computation_inside_another(client):
    """Manual over x, then over y inside: the inner body sums its row block's two column
    tiles and adds its device id; leaving each region puts the tiles back together."""
    x = _arange()
    rows = []
    for i in range(X):
        total = x[2 * i:2 * i + 2, :4] + x[2 * i:2 * i + 2, 4:]
        rows.append(np.concatenate([total + (2 * i + j) for j in range(Y)], axis=1) + 1)
    np.testing.assert_array_equal(_run(client, NESTED, x)[0], np.concatenate(rows))
