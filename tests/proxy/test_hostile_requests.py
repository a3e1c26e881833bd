"""Hostile requests through a session, on the pjrt and reference backends: every one of the
session's request kinds sent with malformed field values gets an error status of an ifrtpy
error (INVALID_ARGUMENT naming what was wrong, or the documented code: NOT_FOUND for an
unknown handle, UNIMPLEMENTED for what the server does not serve), never a crash, a hang or
a foreign exception; and the session goes on serving good requests afterwards.

Requests go through :meth:`Session.handle` directly (no gRPC), so each case costs
milliseconds. Sizes, shardings, layouts, strides and programs that used to crash or hang
the server, and the bytes a padded read returns, have cases of their own below.
"""

from __future__ import annotations

import dataclasses
import queue
from typing import Any, Callable

import numpy as np
import pytest

pytest.importorskip("google.protobuf")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy.errors import Code, IfrtError  # noqa: E402
from ifrtpy.proxy._protocol import messages  # noqa: E402
from ifrtpy.proxy.session import Budget, Limits, Session  # noqa: E402

M = messages()
WAIT_S = 60  # a bound on a hang, not a timing assertion
INVALID, NOT_FOUND, EXHAUSTED, UNIMPLEMENTED = (Code.INVALID_ARGUMENT, Code.NOT_FOUND,
                                                Code.RESOURCE_EXHAUSTED, Code.UNIMPLEMENTED)
HOST_LIMIT = 1 << 24
F32 = M.DTypeProto(kind=M.DTypeProto.Kind.Value("KIND_F32"))


class Recording(Session):
    """A session that keeps the exception of every error it answers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.errors: list[BaseException] = []

    def answer_error(self, op_id: int, error: BaseException) -> None:
        self.errors.append(error)
        super().answer_error(op_id, error)


class Driver:
    """One session, driven in-process: ``call(kind, message)`` returns its response."""

    def __init__(self, client: Any) -> None:
        self.responses: queue.Queue = queue.Queue()
        self.session = Recording(1, "test", client, Limits(max_host_buffer_bytes=HOST_LIMIT,
                                                            max_handles=1 << 12),
                                 25, self.receive, Budget(1 << 40, "the server"))
        self.op = 0
        self.buffers = iter(range(1 << 20, 1 << 21))

    def receive(self, response: Any) -> None:
        """The session's ``send``: an ``IfrtResponse``, or its bytes."""
        if isinstance(response, (bytes, bytearray, memoryview)):
            response = M.IfrtResponse.FromString(bytes(response))
        self.responses.put(response)

    def call(self, kind: str, message: Any) -> Any:
        self.op += 1
        request = M.IfrtRequest()
        request.request_metadata.op_id = self.op
        getattr(request, kind).CopyFrom(message)
        self.session.handle(request)
        response = self.responses.get(timeout=WAIT_S)
        assert response.response_metadata.op_id == self.op
        return response

    def ok(self, kind: str, message: Any) -> Any:
        response = self.call(kind, message)
        status = response.response_metadata.status
        assert status.code == 0, (kind, status.code, status.message)
        return getattr(response, kind[: -len("request")] + "response")

    def put(self, values: np.ndarray, sharding: Any, handle: int = 0) -> int:
        """The handle of a new array of ``values`` (``handle``, or one the server mints)."""
        buffer = next(self.buffers)
        self.session.store_host_buffer(buffer, np.ascontiguousarray(values).tobytes())
        request = M.MakeArrayFromHostBufferRequest(
            dtype=F32, shape=M.ShapeProto(dims=values.shape), sharding=sharding,
            host_buffer_handle=buffer)
        if handle:
            request.array_handle = handle
        return self.ok("make_array_from_host_buffer_request", request).array_handle

    def get(self, handle: int, shape: tuple[int, ...]) -> np.ndarray:
        buffer = next(self.buffers)
        self.ok("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
            array_handle=handle, host_buffer_handle=buffer))
        return np.frombuffer(bytes(self.session.take_host_buffer(buffer)), np.float32).reshape(shape)


# -- protocol values --------------------------------------------------------------------------

def serialized_sharding(type_name: str, inner: Any) -> Any:
    data = inner if isinstance(inner, bytes) else inner.SerializeToString()
    return M.ShardingProto(serialized_sharding=M.Serialized(type_name=type_name, data=data))


def single(device_id: int = 0, memory_kind: str = "") -> Any:
    inner = M.SingleDeviceShardingProto(device_id=device_id)
    if memory_kind:
        inner.memory_kind = memory_kind
    return serialized_sharding("xla::ifrt::SingleDeviceSharding", inner)


def hlo(op: Any, device_ids: Any = (0, 1)) -> Any:
    return serialized_sharding("xla::ifrt::HloSharding", M.HloShardingProto(
        devices=M.DeviceListProto(device_ids=device_ids), xla_op_sharding=op))


ROWS = M.OpSharding(type=3, tile_assignment_dimensions=[2, 1], tile_assignment_devices=[0, 1])


def spec(dims: Any, sharding: Any, dtype: Any = F32) -> Any:
    return M.ArraySpecProto(dtype=dtype, shape=M.ShapeProto(dims=dims), sharding=sharding)


def dtype(kind: int) -> Any:
    return M.DTypeProto(kind=kind)


#: OpShardings that are not HLO shardings; each used to crash jaxlib's reader, allocate
#: without bound, or be read as something else.
BAD_OP_SHARDINGS = {
    "iota_transpose_perm out of range": dict(type=3, tile_assignment_dimensions=[2],
                                             iota_reshape_dims=[2], iota_transpose_perm=[5]),
    "iota_transpose_perm negative": dict(type=3, tile_assignment_dimensions=[2],
                                         iota_reshape_dims=[2], iota_transpose_perm=[-1]),
    "iota_transpose_perm huge": dict(type=3, tile_assignment_dimensions=[2],
                                     iota_reshape_dims=[1, 2], iota_transpose_perm=[0, 1 << 30]),
    "iota_transpose_perm not a permutation": dict(
        type=3, tile_assignment_dimensions=[2], iota_reshape_dims=[1, 2],
        iota_transpose_perm=[1, 1]),
    "iota_transpose_perm short": dict(type=3, tile_assignment_dimensions=[2],
                                      iota_reshape_dims=[1, 2], iota_transpose_perm=[0]),
    "iota_reshape_dims product": dict(type=3, tile_assignment_dimensions=[2],
                                      iota_reshape_dims=[3], iota_transpose_perm=[0]),
    "iota_reshape_dims zero": dict(type=3, tile_assignment_dimensions=[2],
                                   iota_reshape_dims=[0, 2], iota_transpose_perm=[0, 1]),
    "iota and devices both": dict(type=3, tile_assignment_dimensions=[2], iota_reshape_dims=[2],
                                  iota_transpose_perm=[0], tile_assignment_devices=[0, 1]),
    "tile_assignment_dimensions overflow": dict(
        type=3, tile_assignment_dimensions=[1 << 40, 1 << 40],
        iota_reshape_dims=[1 << 40, 1 << 40], iota_transpose_perm=[0, 1]),
    "tile_assignment_dimensions huge": dict(type=3, tile_assignment_dimensions=[1 << 31, 2],
                                            iota_reshape_dims=[1 << 32], iota_transpose_perm=[0]),
    "tile_assignment_dimensions negative": dict(type=3, tile_assignment_dimensions=[-2],
                                                tile_assignment_devices=[0, 1]),
    "tile_assignment_dimensions empty": dict(type=3, tile_assignment_devices=[0, 1]),
    "tile_assignment_devices count": dict(type=3, tile_assignment_dimensions=[2, 2],
                                          tile_assignment_devices=[0, 1, 0]),
    "tile_assignment_devices out of range": dict(type=3, tile_assignment_dimensions=[2],
                                                 tile_assignment_devices=[0, 7]),
    "tile_assignment_devices negative": dict(type=3, tile_assignment_dimensions=[2],
                                             tile_assignment_devices=[-1, 0]),
    "tile_assignment_devices repeated": dict(type=3, tile_assignment_dimensions=[2],
                                             tile_assignment_devices=[0, 0]),
    "tile count is not the device count": dict(type=3, tile_assignment_dimensions=[4],
                                               iota_reshape_dims=[4], iota_transpose_perm=[0]),
    "last_tile_dims unknown type": dict(type=3, tile_assignment_dimensions=[1, 2],
                                        tile_assignment_devices=[0, 1], last_tile_dims=[99]),
    "last_tile_dims too many": dict(type=3, tile_assignment_dimensions=[2],
                                    tile_assignment_devices=[0, 1], last_tile_dims=[0, 0, 0]),
    "last_tile_dims and replicate_on_last_tile_dim": dict(
        type=3, tile_assignment_dimensions=[1, 2], tile_assignment_devices=[0, 1],
        replicate_on_last_tile_dim=True, last_tile_dims=[0]),
    "maximal without device": dict(type=1),
    "maximal with two devices": dict(type=1, tile_assignment_dimensions=[1],
                                     tile_assignment_devices=[0, 1]),
    "maximal out of range": dict(type=1, tile_assignment_dimensions=[1],
                                 tile_assignment_devices=[5]),
    "unknown type": dict(type=77),
    "tuple": dict(type=2, tuple_shardings=[dict(type=3, tile_assignment_dimensions=[2],
                                                iota_reshape_dims=[2], iota_transpose_perm=[9])]),
    "mesh-based": dict(type=3, named_sharding=dict(
        mesh=dict(axes=[dict(name="x", size=2)], device_ids=[0, 1]),
        dim_shardings=[dict(axes=[dict(mesh_axis_index=0)])])),
}

#: Shardings that name no usable devices, or that do not decode.
BAD_SHARDINGS = {
    "no type": M.ShardingProto(),
    "unknown type": serialized_sharding("xla::ifrt::NoSuchSharding", b""),
    "garbage single-device": serialized_sharding("xla::ifrt::SingleDeviceSharding", b"\xff\xff\xff"),
    "garbage HLO": serialized_sharding("xla::ifrt::HloSharding", b"\x0a\x05\xff"),
    "device out of range": single(99),
    "negative device": single(-1),
    "unknown memory kind": single(0, "no_such_memory"),
    "HLO with no devices": hlo(ROWS, ()),
    "HLO with unknown devices": hlo(ROWS, (0, 99)),
    "concrete-even shapes": serialized_sharding(
        "xla::ifrt::ConcreteEvenSharding", M.ConcreteEvenShardingProto(
            devices=M.DeviceListProto(device_ids=[0, 1]), shape=M.ShapeProto(dims=[4]),
            shard_shape=M.ShapeProto(dims=[-3]))),
    "concrete shard count": serialized_sharding(
        "xla::ifrt::ConcreteSharding", M.ConcreteShardingProto(
            devices=M.DeviceListProto(device_ids=[0, 1]), shape=M.ShapeProto(dims=[4]),
            shard_shapes=[M.ShapeProto(dims=[4])] * 5)),
    "concrete huge shape": serialized_sharding(
        "xla::ifrt::ConcreteSharding", M.ConcreteShardingProto(
            devices=M.DeviceListProto(device_ids=[0, 1]), shape=M.ShapeProto(dims=[1 << 62] * 2),
            shard_shapes=[M.ShapeProto(dims=[1 << 62] * 2)] * 2)),
    **{f"HLO {name}": hlo(M.OpSharding(**op)) for name, op in BAD_OP_SHARDINGS.items()},
}

#: Shapes no array has, or none the server should be made to think about.
BAD_DIMS = {
    "negative": [-1, 4],
    "overflowing int64": [1 << 40, 1 << 40],
    "over int64 bytes": [1 << 61],
    "over any memory": [1 << 50, 1 << 10],
}

BAD_DTYPES = {"unspecified": 0, "token": 17, "opaque": 14, "unknown": 12345}

BAD_STRIDES = {
    "huge": [1 << 40],
    "overflowing": [1 << 62],
    "negative": [-(1 << 62)],
    "too many": [4, 4, 4],
    "unaligned": [3],
}

ADD_ONE = """module @add_one { func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %c = stablehlo.constant dense<1.0> : tensor<4xf32>
    %0 = stablehlo.add %a, %c : tensor<4xf32>
    return %0 : tensor<4xf32> } }"""


def compile_options(replicas: int = 1, partitions: int = 1, devices: Any = ((0,),),
                    shape: Any = None) -> Any:
    options = M.XlaCompileOptionsProto()
    build = options.compile_options.executable_build_options
    build.num_replicas, build.num_partitions = replicas, partitions
    if devices is not None:
        rows, columns = shape or (replicas, partitions)
        build.device_assignment.replica_count = rows
        build.device_assignment.computation_count = columns
        for column in devices:
            build.device_assignment.computation_devices.add(replica_device_ids=list(column))
    return M.Serialized(type_name="xla::ifrt::XlaCompileOptions", data=options.SerializeToString())


def compile_request(text: Any = ADD_ONE, options: Any = None, type_name: str = "xla::ifrt::XlaProgram") -> Any:
    data = text.encode() if isinstance(text, str) else text
    return M.CompileRequest(program=M.Serialized(type_name=type_name, data=data),
                            compile_options=options if options is not None else compile_options())


FEEDS = {
    "stablehlo.infeed": """
        %t = stablehlo.after_all : !stablehlo.token
        %i:2 = "stablehlo.infeed"(%t) {infeed_config = ""} : (!stablehlo.token) -> (tensor<4xf32>, !stablehlo.token)
        %0 = stablehlo.add %a, %i#0 : tensor<4xf32>""",
    "stablehlo.outfeed": """
        %t = stablehlo.after_all : !stablehlo.token
        %o = "stablehlo.outfeed"(%a, %t) {outfeed_config = ""} : (tensor<4xf32>, !stablehlo.token) -> !stablehlo.token
        %0 = stablehlo.add %a, %a : tensor<4xf32>""",
    "stablehlo.recv": """
        %t = stablehlo.after_all : !stablehlo.token
        %r:2 = "stablehlo.recv"(%t) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 3>, is_host_transfer = true} : (!stablehlo.token) -> (tensor<4xf32>, !stablehlo.token)
        %0 = stablehlo.add %a, %r#0 : tensor<4xf32>""",
    "stablehlo.send": """
        %t = stablehlo.after_all : !stablehlo.token
        %s = "stablehlo.send"(%a, %t) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 2>, is_host_transfer = true} : (tensor<4xf32>, !stablehlo.token) -> !stablehlo.token
        %0 = stablehlo.add %a, %a : tensor<4xf32>""",
}


def fed(body: str) -> str:
    return ("module @fed { func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {"
            + body + "\n return %0 : tensor<4xf32> } }")


# -- the table ------------------------------------------------------------------------------

@dataclasses.dataclass
class World:
    """What the good state of a case's session holds: arrays ``x`` (f32[4] on device 0) and
    ``rows`` (f32[4, 2] in two rows over devices 0 and 1), and an executable ``exe`` adding
    one to an f32[4]."""

    driver: Driver
    x: int
    rows: int
    exe: int


X = np.arange(4, dtype=np.float32)
ROWS_VALUES = np.arange(8, dtype=np.float32).reshape(4, 2)


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str
    what: str
    make: Callable[[World], Any]
    codes: tuple[int, ...] = (INVALID,)
    says: str = ""  # a word the error's message must hold


def put_case(what: str, codes=(INVALID,), says="", data=None, **fields: Any) -> Case:
    def make(w: World) -> Any:
        buffer = next(w.driver.buffers)
        w.driver.session.store_host_buffer(buffer, X.tobytes() if data is None else data)
        request = M.MakeArrayFromHostBufferRequest(dtype=F32, shape=M.ShapeProto(dims=[4]),
                                                   sharding=single(), host_buffer_handle=buffer)
        for name, value in fields.items():
            if name == "byte_strides":
                request.byte_strides.strides.extend(value)
            elif isinstance(value, int):
                setattr(request, name, value)
            else:
                getattr(request, name).CopyFrom(value)
        return request
    return Case("make_array_from_host_buffer_request", what, make, codes, says)


def layout(type_name: str, data: Any) -> Any:
    proto = M.LayoutProto()
    proto.serialized_layout.type_name = type_name
    proto.serialized_layout.data = data if isinstance(data, bytes) else data.SerializeToString()
    return proto


def pjrt_layout(minor_to_major: Any, tiles: Any = (), bits: int = 0) -> Any:
    xla = M.PjRtLayoutProto()
    xla.xla_layout.minor_to_major.extend(minor_to_major)
    for tile in tiles:
        xla.xla_layout.tiles.add(dimensions=tile)
    xla.xla_layout.element_size_in_bits = bits
    return layout("xla::ifrt::PjRtLayout", xla)


def shards_case(what: str, codes=(INVALID,), says="", dims=(4,), strides=None, indices=(0,),
                sharding=None, count=1, buffer_dims=(4,)) -> Case:
    def make(w: World) -> Any:
        request = M.MakeArraysFromHostBufferShardsRequest()
        entry = request.specs.add(array_spec=spec(list(dims), sharding or single()))
        for _ in range(count):
            buffer = next(w.driver.buffers)
            w.driver.session.store_host_buffer(buffer, X.tobytes())
            host = entry.host_buffers.add(dtype=F32, shape=M.ShapeProto(dims=list(buffer_dims)),
                                          host_buffer_handle=buffer)
            if strides is not None:
                host.byte_strides.strides.extend(strides)
            entry.addressable_shard_indices.add(indices=list(indices))
        return request
    return Case("make_arrays_from_host_buffer_shards_request", what, make, codes, says)


def remap(w: World, mappings: Any, inputs: Any = None, outputs: Any = None,
          handles: Any = None) -> Any:
    plan = M.RemapPlanProto(input_specs=inputs or [spec([4], single(0))],
                            output_specs=outputs or [spec([4], single(1))])
    for m in mappings:
        plan.mappings.add(**m)
    return M.RemapArraysRequest(plan=plan, array_handles=[w.x] if handles is None else handles,
                                copy_semantics=1)


ONE_TO_ONE = dict(in_array=0, out_array=0, from_start=[0], from_end=[1], from_step=[1],
                  to_start=[0], to_end=[1], to_step=[1])


def cases() -> list[Case]:
    c: list[Case] = []
    k = "make_array_from_host_buffer_request"
    for name, sharding in BAD_SHARDINGS.items():
        codes = (UNIMPLEMENTED,) if name in ("no type", "unknown type", "HLO mesh-based") \
            else (INVALID,)
        c.append(put_case(f"sharding: {name}", codes, sharding=sharding))
    for name, dims in BAD_DIMS.items():
        c.append(put_case(f"dims: {name}", shape=M.ShapeProto(dims=dims)))
    for name, kind in BAD_DTYPES.items():
        c.append(put_case(f"dtype: {name}", dtype=dtype(kind)))
    for name, strides in BAD_STRIDES.items():
        c.append(put_case(f"byte_strides: {name}", byte_strides=strides))
    c += [
        put_case("too few bytes", data=b"\0" * 3, says="3 bytes"),
        put_case("layout: garbage", layout=layout("xla::ifrt::PjRtLayout", b"\xff\x01")),
        put_case("layout: unknown type", (UNIMPLEMENTED,), layout=layout("NoSuchLayout", b"")),
        put_case("layout: minor_to_major out of range", layout=pjrt_layout([5])),
        put_case("layout: another rank", layout=pjrt_layout([1, 0])),
        put_case("layout: negative tile", layout=pjrt_layout([0], [[-8]])),
        put_case("layout: huge tile", (INVALID, UNIMPLEMENTED), layout=pjrt_layout([0], [[1 << 62]])),
        put_case("layout: element size", layout=pjrt_layout([0], bits=-1)),
        put_case("string with garbage contents", dtype=dtype(99), data=b"\xff\xff\xff"),
        put_case("result handle in use", says="already in use", array_handle=1),
    ]
    k = "make_arrays_from_host_buffer_shards_request"
    c += [
        shards_case("sharding: device out of range", sharding=single(99)),
        shards_case("sharding: HLO perm", sharding=hlo(M.OpSharding(
            **BAD_OP_SHARDINGS["iota_transpose_perm out of range"]))),
        shards_case("dims: overflowing", dims=(1 << 40, 1 << 40)),
        shards_case("buffer dims: overflowing", buffer_dims=(1 << 40, 1 << 40)),
        shards_case("buffer dims: negative", buffer_dims=(-4,)),
        shards_case("shard index out of range", indices=(5,)),
        shards_case("shard index negative", indices=(-1,)),
        shards_case("two buffers for one shard", indices=(0,), count=2),
        shards_case("byte_strides: huge", strides=[1 << 40]),
        Case(k, "index lists without buffers", lambda w: M.MakeArraysFromHostBufferShardsRequest(
            specs=[M.MakeArraysFromHostBufferShardsRequest.MakeArraysFromHostBufferShardsSpec(
                array_spec=spec([4], single()),
                addressable_shard_indices=[M.MakeArraysFromHostBufferShardsRequest.ShardIndices(
                    indices=[0])])])),
        Case(k, "more result handles than specs", lambda w: M.MakeArraysFromHostBufferShardsRequest(
            array_handles=[9001, 9002])),
    ]
    k = "make_error_arrays_request"
    c += [
        Case(k, "spec: HLO perm", lambda w: M.MakeErrorArraysRequest(
            error=M.StatusProto(code=9, message="x"), array_specs=[spec([4], hlo(M.OpSharding(
                **BAD_OP_SHARDINGS["iota_transpose_perm out of range"])))])),
        Case(k, "spec: dims overflowing", lambda w: M.MakeErrorArraysRequest(
            error=M.StatusProto(code=9, message="x"), array_specs=[spec(BAD_DIMS[
                "overflowing int64"], single())])),
        Case(k, "spec: dtype unknown", lambda w: M.MakeErrorArraysRequest(
            error=M.StatusProto(code=9, message="x"), array_specs=[spec([4], single(), dtype(777))])),
        Case(k, "error: OK", lambda w: M.MakeErrorArraysRequest(
            error=M.StatusProto(code=0), array_specs=[spec([4], single())]), says="error"),
        Case(k, "result handle count", lambda w: M.MakeErrorArraysRequest(
            error=M.StatusProto(code=9, message="x"), array_specs=[spec([4], single())],
            array_handles=[9100, 9101])),
    ]
    k = "copy_to_host_buffer_request"

    def copy(strides: Any, handle: Callable[[World], int] = lambda w: w.x) -> Callable:
        def make(w: World) -> Any:
            request = M.CopyToHostBufferRequest(array_handle=handle(w),
                                                host_buffer_handle=next(w.driver.buffers))
            request.byte_strides.strides.extend(strides)
            return request
        return make

    c += [Case(k, f"byte_strides: {name}", copy(s), (INVALID, EXHAUSTED))
          for name, s in BAD_STRIDES.items()]
    c += [
        Case(k, "byte_strides: over the host-buffer limit", copy([HOST_LIMIT]), (EXHAUSTED,),
             says=str(HOST_LIMIT)),
        Case(k, "byte_strides: overlapping", copy([0, 4], lambda w: w.rows)),
        Case(k, "unknown array", lambda w: M.CopyToHostBufferRequest(
            array_handle=424242, host_buffer_handle=1), (NOT_FOUND,), says="424242"),
    ]
    for name, shard_semantics, copy_semantics in (("copy semantics", None, 99),
                                                  ("shard semantics", 99, 1)):
        def make_dis(w: World, s=shard_semantics, cs=copy_semantics) -> Any:
            request = M.DisassembleIntoSingleDeviceArraysRequest(array_handle=w.rows,
                                                                 copy_semantics=cs)
            if s is not None:
                request.single_device_shard_semantics = s
            return request
        c.append(Case("disassemble_into_single_device_arrays_request", f"unknown {name}",
                      make_dis, says=str(99)))
    c += [
        Case("disassemble_into_single_device_arrays_request", "result handle count",
             lambda w: M.DisassembleIntoSingleDeviceArraysRequest(
                 array_handle=w.rows, copy_semantics=1, result_handles=[9200, 9201, 9202])),
        Case("fully_replicated_shard_request", "not replicated",
             lambda w: M.FullyReplicatedShardRequest(array_handle=w.rows, copy_semantics=1)),
        Case("fully_replicated_shard_request", "unknown copy semantics",
             lambda w: M.FullyReplicatedShardRequest(array_handle=w.x, copy_semantics=77)),
    ]
    k = "assemble_array_from_single_device_arrays_request"

    def assemble(dims: Any = (4, 2), sharding: Any = None, handles: Any = None, **kw: Any) -> Callable:
        def make(w: World) -> Any:
            pieces = handles(w) if handles else [w.x, w.x]
            return M.AssembleArrayFromSingleDeviceArraysRequest(
                shape=M.ShapeProto(dims=list(dims)), sharding=sharding or hlo(ROWS),
                single_device_array_handles=pieces, copy_semantics=1, **kw)
        return make

    c += [
        Case(k, "dims overflowing", assemble(BAD_DIMS["overflowing int64"])),
        Case(k, "dims negative", assemble((-4, 2))),
        Case(k, "sharding: HLO perm", assemble(sharding=hlo(M.OpSharding(
            **BAD_OP_SHARDINGS["iota_transpose_perm out of range"])))),
        Case(k, "wrong piece count", assemble(handles=lambda w: [w.x])),
        Case(k, "pieces of another shape", assemble()),
        Case(k, "unknown dtype", assemble(dtype=dtype(555))),
        Case(k, "unknown shard semantics", assemble(single_device_shard_semantics=42)),
    ]
    k = "copy_arrays_request"
    c += [
        Case(k, "unknown device", lambda w: M.CopyArraysRequest(array_handles=[w.x],
                                                                device_ids=[99], copy_semantics=1)),
        Case(k, "negative device", lambda w: M.CopyArraysRequest(array_handles=[w.x],
                                                                 device_ids=[-5], copy_semantics=1)),
        Case(k, "device count", lambda w: M.CopyArraysRequest(array_handles=[w.rows],
                                                              device_ids=[1], copy_semantics=1)),
        Case(k, "unknown memory kind", lambda w: M.CopyArraysRequest(
            array_handles=[w.x], memory_kind="no_such_memory", copy_semantics=1)),
        Case(k, "unknown copy semantics", lambda w: M.CopyArraysRequest(array_handles=[w.x],
                                                                        copy_semantics=13)),
        Case(k, "result handle count", lambda w: M.CopyArraysRequest(
            array_handles=[w.x], copy_semantics=1, result_handles=[9300, 9301])),
    ]
    for k in ("reshard_arrays_request", "bitcast_arrays_request"):
        make_type = M.ReshardArraysRequest if k.startswith("reshard") else M.BitcastArraysRequest
        for name, s in (("sharding: HLO perm", spec([4], hlo(M.OpSharding(
                            **BAD_OP_SHARDINGS["iota_transpose_perm out of range"])))),
                        ("sharding: unknown device", spec([4], single(99))),
                        ("dims: overflowing", spec(BAD_DIMS["overflowing int64"], single())),
                        ("dims: over int64 bytes", spec(BAD_DIMS["over int64 bytes"], single())),
                        ("dtype: unknown", spec([4], single(), dtype(909)))):
            c.append(Case(k, name, lambda w, s=s, t=make_type: t(
                array_handles=[w.x], array_specs=[s], copy_semantics=1)))
        c += [
            Case(k, "spec count", lambda w, t=make_type: t(array_handles=[w.x], array_specs=[],
                                                           copy_semantics=1)),
            Case(k, "unknown copy semantics", lambda w, t=make_type: t(
                array_handles=[w.x], array_specs=[spec([4], single(1))], copy_semantics=31)),
        ]
    k = "remap_arrays_request"
    c += [
        Case(k, "interval counts", lambda w: remap(w, [dict(ONE_TO_ONE, from_step=[])])),
        Case(k, "negative interval", lambda w: remap(w, [dict(ONE_TO_ONE, from_start=[-3])])),
        Case(k, "huge interval", lambda w: remap(w, [dict(ONE_TO_ONE, from_end=[1 << 62],
                                                          to_end=[1 << 62])])),
        Case(k, "zero step", lambda w: remap(w, [dict(ONE_TO_ONE, from_step=[0])])),
        Case(k, "in_array out of range", lambda w: remap(w, [dict(ONE_TO_ONE, in_array=7)])),
        Case(k, "out_array negative", lambda w: remap(w, [dict(ONE_TO_ONE, out_array=-1)])),
        Case(k, "spec: dims overflowing", lambda w: remap(w, [ONE_TO_ONE], outputs=[
            spec(BAD_DIMS["overflowing int64"], single(1))])),
        Case(k, "spec: HLO perm", lambda w: remap(w, [ONE_TO_ONE], outputs=[spec([4], hlo(
            M.OpSharding(**BAD_OP_SHARDINGS["iota_transpose_perm out of range"])))])),
        Case(k, "array count", lambda w: remap(w, [ONE_TO_ONE], handles=[w.x, w.x])),
        Case(k, "result handle count", lambda w: M.RemapArraysRequest(
            plan=remap(w, [ONE_TO_ONE]).plan, array_handles=[w.x], copy_semantics=1,
            result_handles=[9400, 9401])),
    ]
    for k, make_type in (("delete_array_request", M.DeleteArrayRequest),
                         ("is_array_deleted_request", M.IsArrayDeletedRequest),
                         ("check_value_ready_request", M.CheckValueReadyRequest)):
        field = "value_handles" if k.startswith("check") else "array_handle"
        value = [777001] if k != "is_array_deleted_request" else 777001
        c.append(Case(k, "unknown array", lambda w, t=make_type, f=field, v=value: t(**{f: v}),
                      (NOT_FOUND,), says="777001"))
    c.append(Case("check_future_request", "unknown future",
                  lambda w: M.CheckFutureRequest(future_handle=31337), (NOT_FOUND,), says="31337"))
    k = "compile_request"
    c += [
        Case(k, "empty program", lambda w: compile_request(b""), says="empty"),
        Case(k, "garbage program", lambda w: compile_request(b"\x00\xffML\xefR garbage")),
        Case(k, "bytecode header, garbage body", lambda w: compile_request(b"ML\xefR\x00\x01\x02")),
        Case(k, "text that is not a program", lambda w: compile_request("this is not MLIR")),
        Case(k, "unknown program type", lambda w: compile_request(type_name="NoSuchProgram"),
             (UNIMPLEMENTED,)),
        Case(k, "garbage options", lambda w: compile_request(options=M.Serialized(
            type_name="xla::ifrt::XlaCompileOptions", data=b"\xff\xff\xff"))),
        Case(k, "unknown options type", lambda w: compile_request(options=M.Serialized(
            type_name="NoSuchOptions")), (UNIMPLEMENTED,)),
        Case(k, "negative replicas", lambda w: compile_request(options=compile_options(
            -1, 1, None))),
        Case(k, "huge partitions", lambda w: compile_request(options=compile_options(
            1, 1 << 40, None))),
        Case(k, "assignment of another size", lambda w: compile_request(options=compile_options(
            1, 1, ((0,), (1,)), shape=(1, 2)))),
        Case(k, "assignment with an unknown device", lambda w: compile_request(
            options=compile_options(1, 1, ((99,),)))),
        Case(k, "assignment with a negative device", lambda w: compile_request(
            options=compile_options(1, 1, ((-2,),)))),
        Case(k, "host callbacks", lambda w: M.CompileRequest(
            program=compile_request().program, compile_options=compile_options(),
            host_callbacks=[b"callback"]), (UNIMPLEMENTED,)),
    ]
    for op, body in FEEDS.items():
        c.append(Case(k, f"program with {op}", lambda w, b=body: compile_request(fed(b)),
                      (UNIMPLEMENTED,), says=op))
    k = "loaded_executable_execute_request"
    c += [
        Case(k, "argument count", lambda w: M.LoadedExecutableExecuteRequest(
            loaded_executable_handle=w.exe, args_handles=[w.x, w.x])),
        Case(k, "argument shape", lambda w: M.LoadedExecutableExecuteRequest(
            loaded_executable_handle=w.exe, args_handles=[w.rows])),
        Case(k, "unknown device", lambda w: M.LoadedExecutableExecuteRequest(
            loaded_executable_handle=w.exe, args_handles=[w.x], device_ids=[99])),
        Case(k, "result handle count", lambda w: M.LoadedExecutableExecuteRequest(
            loaded_executable_handle=w.exe, args_handles=[w.x], result_array_handle=[1, 2, 3])),
        Case(k, "non-donatable index", lambda w: M.LoadedExecutableExecuteRequest(
            loaded_executable_handle=w.exe, args_handles=[w.x],
            execute_options=M.ExecuteOptionsProto(non_donatable_input_indices=[-7]))),
        Case(k, "unknown executable", lambda w: M.LoadedExecutableExecuteRequest(
            loaded_executable_handle=5150, args_handles=[w.x]), (NOT_FOUND,), says="5150"),
        Case("loaded_executable_fetch_execute_result_request", "unknown status",
             lambda w: M.LoadedExecutableFetchExecuteResultRequest(result_status_handle=4040),
             (NOT_FOUND,), says="4040"),
    ]
    for k, make_type, field in (
            ("loaded_executable_metadata_request", M.LoadedExecutableMetadataRequest,
             "loaded_executable_handle"),
            ("loaded_executable_mpmd_metadata_request", M.LoadedExecutableMpmdMetadataRequest,
             "mpmd_loaded_executable_handle"),
            ("loaded_executable_cost_analysis_request", M.LoadedExecutableCostAnalysisRequest,
             "loaded_executable_handle"),
            ("loaded_executable_mpmd_cost_analysis_request",
             M.LoadedExecutableMpmdCostAnalysisRequest, "loaded_executable_handle"),
            ("loaded_executable_human_readable_program_text_request",
             M.LoadedExecutableHumanReadableProgramTextRequest, "loaded_executable_handle"),
            ("loaded_executable_delete_request", M.LoadedExecutableDeleteRequest,
             "loaded_executable_handle"),
            ("loaded_executable_is_deleted_request", M.LoadedExecutableIsDeletedRequest,
             "loaded_executable_handle")):
        c.append(Case(k, "unknown executable", lambda w, t=make_type, f=field: t(**{f: 6060}),
                      (NOT_FOUND,), says="6060"))
    c += [
        Case("loaded_host_callback_poll_request", "any", lambda w: M.LoadedHostCallbackPollRequest(
            loaded_host_callback_handle=3), (UNIMPLEMENTED,)),
        Case("loaded_host_callback_return_request", "any",
             lambda w: M.LoadedHostCallbackReturnRequest(host_callback_execution_handle=3),
             (UNIMPLEMENTED,)),
    ]
    k = "get_default_device_assignment_request"
    c += [Case(k, f"{r} x {p}", lambda w, r=r, p=p: M.GetDefaultDeviceAssignmentRequest(
        num_replicas=r, num_partitions=p)) for r, p in ((0, 1), ((1 << 64) - 1, 1), (1, 1 << 40),
                                                       (1 << 31, 1 << 31))]
    k = "get_default_layout_request"

    def default_layout(dims: Any = (4,), kind: Any = F32, device: int = 0, memory: str = "") -> Callable:
        return lambda w: M.GetDefaultLayoutRequest(dtype=kind, dims=list(dims), device_id=device,
                                                   memory_kind=memory)

    c += [Case(k, f"dims: {name}", default_layout(dims)) for name, dims in BAD_DIMS.items()]
    c += [Case(k, f"dtype: {name}", default_layout(kind=dtype(kind))) for name, kind in
          BAD_DTYPES.items()]
    c += [
        Case(k, "unknown device", default_layout(device=99)),
        Case(k, "unknown memory kind", default_layout(memory="no_such_memory")),
    ]
    # kinds of newer jaxlibs' protocols (0.12.1), refused by name where jaxlib has them
    newer = [
        Case("hash_values_request", "any", lambda w: M.HashValuesRequest(value_handles=[w.x]),
             (UNIMPLEMENTED,), says="HashValues is not served"),
        Case("cancel_execution_request", "any",
             lambda w: M.CancelExecutionRequest(cancellation_handle=7), (UNIMPLEMENTED,),
             says="CancelExecution is not served"),
        Case("deserialize_loaded_executable_request", "any",
             lambda w: M.DeserializeLoadedExecutableRequest(serialized_executable_handle=7),
             (UNIMPLEMENTED,), says="DeserializeLoadedExecutable is not served"),
    ]
    return c + [case for case in newer if case.kind in M.IfrtRequest.DESCRIPTOR.fields_by_name]


CASES = cases()

#: Every request kind of a session has hostile cases here, but init (no fields) and the
#: destructs (unknown handles are ignored, as IFRT destroys are).
UNTESTED = {"init_request", "destruct_array_request", "loaded_executable_destruct_request"}


def test_every_request_kind_has_hostile_cases():
    """Every kind the installed jaxlib's protocol has (32 in jaxlib 0.10 to 0.12.0, 35 in
    0.12.1) has hostile cases, and the session serves it or refuses it by name."""
    from ifrtpy.proxy.session import kinds as served

    kinds = set(M.IfrtRequest.DESCRIPTOR.fields_by_name) - {"request_metadata"}
    assert kinds - UNTESTED == {case.kind for case in CASES}
    assert kinds == set(served())
    assert len(kinds) >= 32


@pytest.fixture(scope="module", params=["pjrt", "reference"])
def client(request):
    return ifrt.get_client(request.param, device_count=2)


@pytest.fixture(scope="module")
def world(client):
    driver = Driver(client)
    x = driver.put(X, single(0), 1)
    rows = driver.put(ROWS_VALUES, hlo(ROWS), 2)
    exe = driver.ok("compile_request", compile_request()).loaded_executable_handle
    return World(driver, x, rows, exe)


def serves(world: World) -> None:
    """The session still serves: its arrays hold their values, and a put, an execute and a
    read back give NumPy's answer."""
    d = world.driver
    np.testing.assert_array_equal(d.get(world.x, (4,)), X)
    np.testing.assert_array_equal(d.get(world.rows, (4, 2)), ROWS_VALUES)
    fresh = d.put(X * 2, single(1), 3)
    out = d.ok("loaded_executable_execute_request", M.LoadedExecutableExecuteRequest(
        loaded_executable_handle=world.exe, args_handles=[world.x])).outputs[0].array_handle
    np.testing.assert_array_equal(d.get(out, (4,)), X + 1)
    np.testing.assert_array_equal(d.get(fresh, (4,)), X * 2)
    d.ok("destruct_array_request", M.DestructArrayRequest(array_handle=[out, fresh]))


@pytest.mark.parametrize("case", CASES, ids=[f"{c.kind[:-8]}: {c.what}" for c in CASES])
def test_a_hostile_request_gets_an_ifrtpy_error_and_the_session_serves_on(world, case):
    d = world.driver
    errors = len(d.session.errors)
    response = d.call(case.kind, case.make(world))
    status = response.response_metadata.status
    assert status.code in case.codes, (status.code, status.message)
    assert status.message and (case.says in status.message), status.message
    error = d.session.errors[errors]
    assert isinstance(error, IfrtError), repr(error)
    assert response.WhichOneof("response") is None
    serves(world)


# -- what a read returns --------------------------------------------------------------------

def test_a_padded_read_returns_the_elements_and_zeros_between_them(world):
    """Byte strides that leave gaps: every byte of the host buffer is an element's or a
    zero, never what the server's heap held before (here: another buffer's secret)."""
    d = world.driver
    stride = 1 << 20
    for _ in range(4):  # what a closed session's buffers leave in the heap
        secret = np.full(3 * stride + 4, ord("S"), np.uint8)
        del secret
    buffer = next(d.buffers)
    request = M.CopyToHostBufferRequest(array_handle=world.x, host_buffer_handle=buffer)
    request.byte_strides.strides.extend([stride])
    d.ok("copy_to_host_buffer_request", request)
    data = np.frombuffer(bytes(d.session.take_host_buffer(buffer)), np.uint8)
    assert len(data) == 3 * stride + 4
    elements = np.zeros(len(data), bool)
    for i in range(4):
        elements[i * stride:i * stride + 4] = True
    np.testing.assert_array_equal(data[elements].view(np.float32), X)
    assert not data[~elements].any(), bytes(data[~elements][:32])


def test_a_read_over_the_host_buffer_limit_is_refused_before_it_is_allocated(world):
    d = world.driver
    request = M.CopyToHostBufferRequest(array_handle=world.x,
                                        host_buffer_handle=next(d.buffers))
    request.byte_strides.strides.extend([1 << 44])  # 48 TiB, were it allocated
    status = d.call("copy_to_host_buffer_request", request).response_metadata.status
    assert status.code == EXHAUSTED and str(HOST_LIMIT) in status.message
    serves(world)
