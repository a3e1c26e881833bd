"""The IFRT Proxy server at the protocol level, driven with grpcio directly: its message
table agrees with the installed jaxlib's descriptors; bad versions, headers, messages,
handles and sizes get error statuses (the server goes on serving); per-session limits
answer RESOURCE_EXHAUSTED; unknown custom-call targets are refused at compile."""

import itertools
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402
from ifrtpy.errors import InvalidArgumentError, PermissionDeniedError  # noqa: E402
from ifrtpy.proxy import fields  # noqa: E402

from proxy_helpers import (EXHAUSTED, INVALID, NOT_FOUND, SERVICE,  # noqa: E402
                           SESSION_HEADER, UNIMPLEMENTED, WAIT_S, M, RawSession, compile_request,
                           lookup, put_request, single_device_sharding, status_of, store)
from proxy_helpers import version as _version  # noqa: E402


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client("pjrt", device_count=2)


@pytest.fixture(scope="module")
def server(client):
    with proxy.serve(client, max_host_buffer_bytes=1 << 20, max_handles=64) as running:
        yield running


@pytest.fixture
def channel(server):
    with grpc.insecure_channel(server.address) as ch:
        yield ch


@pytest.fixture
def session(channel):
    raw = RawSession(channel)
    yield raw
    raw.close()


# -- the message table ---------------------------------------------------------------------

def test_the_field_table_agrees_with_the_installed_jaxlib():
    assert len(fields.expected()) > 50
    assert fields.mismatches() == []


def test_the_field_table_check_finds_a_drifted_field(monkeypatch):
    drifted = fields.FIELDS.replace("op_id=1:fixed64", "op_id=2:fixed64", 1)
    monkeypatch.setattr(fields, "FIELDS", drifted)
    assert any("op_id: expected 2:fixed64" in m for m in fields.mismatches())


# -- versions and headers -------------------------------------------------------------------

def test_get_version_picks_inside_both_ranges_or_refuses(channel):
    get = channel.unary_unary(SERVICE + "GetVersion",
                              request_serializer=M.GrpcGetVersionRequest.SerializeToString,
                              response_deserializer=M.GrpcGetVersionResponse.FromString)
    reply = get(M.GrpcGetVersionRequest(min_version=_version(16, 2), max_version=_version(25, 6)),
                timeout=WAIT_S)
    assert reply.version.protocol_version == 25
    assert reply.version.ifrt_serdes_version_number == 3
    with pytest.raises(grpc.RpcError) as caught:
        get(M.GrpcGetVersionRequest(min_version=_version(26, 0), max_version=_version(30, 3)),
            timeout=WAIT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "26-30" in caught.value.details()


def test_a_session_without_its_header_is_refused(channel):
    stream = channel.stream_stream(SERVICE + "IfrtSession",
                                   request_serializer=M.IfrtRequest.SerializeToString,
                                   response_deserializer=M.IfrtResponse.FromString)
    with pytest.raises(grpc.RpcError) as caught:
        next(stream(iter([M.IfrtRequest()]), timeout=WAIT_S))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert SESSION_HEADER in caught.value.details()


def test_undecodable_bytes_end_the_stream_with_an_error_and_the_server_goes_on(server, channel):
    stream = channel.stream_stream(SERVICE + "IfrtSession", request_serializer=lambda b: b,
                                   response_deserializer=M.IfrtResponse.FromString)
    header = M.GrpcIfrtSessionMetadata(version=_version(25, 3)).SerializeToString()
    with pytest.raises(grpc.RpcError):
        list(stream(iter([b"\xff\xff\xff\xff not a message"]), metadata=[(SESSION_HEADER, header)],
                    timeout=WAIT_S))
    again = RawSession(channel)
    assert again.id > 0
    again.close()


# -- requests ---------------------------------------------------------------------------------

def test_a_request_without_a_kind_gets_an_error_status(session):
    request = M.IfrtRequest()
    request.request_metadata.op_id = 99
    session._requests.put(request)
    response = next(session._responses)
    assert response.response_metadata.op_id == 99
    code, message = status_of(response)
    assert code == INVALID and "none of IfrtRequest" in message
    assert response.WhichOneof("response") is None


def test_unknown_handles_get_not_found(session):
    code, message = status_of(session.call("copy_to_host_buffer_request",
                                           M.CopyToHostBufferRequest(array_handle=12345,
                                                                     host_buffer_handle=7)))
    assert code == NOT_FOUND and "12345" in message
    code, message = status_of(session.call("loaded_executable_metadata_request",
                                           M.LoadedExecutableMetadataRequest(
                                               loaded_executable_handle=777)))
    assert code == NOT_FOUND and "777" in message


def test_put_read_back_and_every_ok_response_sets_its_kind(channel, session):
    values = np.arange(6, dtype=np.float32)
    store(channel, session.id, 1, values.tobytes())
    response = session.call("make_array_from_host_buffer_request", put_request(1, [2, 3], 500))
    assert response.WhichOneof("response") == "make_array_from_host_buffer_response"
    assert response.make_array_from_host_buffer_response.array_handle == 500
    response = session.call("copy_to_host_buffer_request",
                            M.CopyToHostBufferRequest(array_handle=500, host_buffer_handle=2))
    assert response.WhichOneof("response") == "copy_to_host_buffer_response"
    data = lookup(channel, session.id, 2)
    np.testing.assert_array_equal(np.frombuffer(data, np.float32), values)
    response = session.call("destruct_array_request", M.DestructArrayRequest(array_handle=[500]))
    assert response.WhichOneof("response") == "destruct_array_response"


def test_sizes_that_disagree_get_errors_bound_to_the_result_handle(channel, session):
    store(channel, session.id, 3, np.zeros(5, np.float32).tobytes())
    code, message = status_of(session.call("make_array_from_host_buffer_request",
                                           put_request(3, [2, 3], 600)))
    assert code == INVALID and "20 bytes" in message and "24" in message
    # a later request naming the failed result handle gets the same error
    code, later = status_of(session.call("copy_to_host_buffer_request",
                                         M.CopyToHostBufferRequest(array_handle=600,
                                                                   host_buffer_handle=4)))
    assert (code, later) == (INVALID, message)
    with pytest.raises(grpc.RpcError) as caught:
        store(channel, session.id, 5, b"x" * 10, size=20)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "20 bytes" in caught.value.details()


def test_limits_answer_resource_exhausted(client, channel, session):
    with pytest.raises(grpc.RpcError) as caught:
        store(channel, session.id, 8, b"\0" * ((1 << 20) + 1))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(1 << 20) in caught.value.details()
    with proxy.serve(client, max_handles=3) as small, grpc.insecure_channel(small.address) as ch:
        raw = RawSession(ch)
        for handle in range(1, 4):  # each put holds one array
            store(ch, raw.id, handle, np.zeros(1, np.float32).tobytes())
            assert status_of(raw.call("make_array_from_host_buffer_request",
                                      put_request(handle, [1])))[0] == 0
        with pytest.raises(grpc.RpcError) as caught:  # a 4th handle: the host buffer
            store(ch, raw.id, 4, np.zeros(1, np.float32).tobytes())
        raw.close()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limit of 3 handles" in caught.value.details()


def test_unregistered_custom_call_targets_are_refused_at_compile(session):
    text = """module @m { func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {
        %0 = stablehlo.custom_call @no_such_target(%a) : (tensor<2xf32>) -> tensor<2xf32>
        return %0 : tensor<2xf32> } }"""
    options = M.XlaCompileOptionsProto()
    options.compile_options.executable_build_options.num_replicas = 1
    options.compile_options.executable_build_options.num_partitions = 1
    request = M.CompileRequest(
        program=M.Serialized(type_name="xla::ifrt::XlaProgram", data=text.encode()),
        compile_options=M.Serialized(type_name="xla::ifrt::XlaCompileOptions",
                                     data=options.SerializeToString()))
    code, message = status_of(session.call("compile_request", request))
    assert code == UNIMPLEMENTED and "no_such_target" in message and "not registered" in message


def test_jax_runtime_targets_compile_and_run(channel, session):
    # lax.dce_sink(..., prevent_mlir_dce=True): a custom call the backend serves itself
    text = ADD_ONE.replace("return %0", """stablehlo.custom_call @dce_sink(%0) {
        has_side_effect = true, api_version = 4 : i32} : (tensor<4xf32>) -> ()
    return %0""")
    exe = ok(session.call("compile_request", compile_request(text)),
             "compile_response").loaded_executable_handle
    host = Host(channel, session)
    a = host.put(np.arange(4, dtype=np.float32), single_device_sharding())
    run = ok(session.call("loaded_executable_execute_request", M.LoadedExecutableExecuteRequest(
        loaded_executable_handle=exe, args_handles=[a])), "loaded_executable_execute_response")
    np.testing.assert_array_equal(host.get(run.outputs[0].array_handle, (4,)), np.arange(1, 5))


def test_sessions_are_listed_and_closed(server, channel):
    before = {s.id for s in server.sessions()}
    raw = RawSession(channel)
    assert raw.id in {s.id for s in server.sessions()} - before
    raw.close()
    deadline = time.monotonic() + WAIT_S  # a bound on a hang, not a timing assertion
    while raw.id in {s.id for s in server.sessions()}:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_serve_refuses_remote_addresses_and_bad_limits(client):
    with pytest.raises(PermissionDeniedError, match="allow_remote"):
        proxy.serve(client, "0.0.0.0:0")
    with pytest.raises(InvalidArgumentError, match="max_handles"):
        proxy.serve(client, max_handles=0)
    with pytest.raises(InvalidArgumentError, match="no_such_limit"):
        proxy.serve(client, no_such_limit=1)


# -- IFRT semantics of the other requests (NumPy is the oracle) --------------------------------

def hlo_sharding(device_ids, tiles):
    """A ShardingProto: an HLO tiled sharding of ``tiles`` over ``device_ids`` (replicated
    when ``tiles`` is empty)."""
    op = M.OpSharding(type=3, tile_assignment_dimensions=tiles,
                      tile_assignment_devices=list(range(len(device_ids)))) if tiles else M.OpSharding(type=0)
    inner = M.HloShardingProto(devices=M.DeviceListProto(device_ids=device_ids), xla_op_sharding=op)
    return M.ShardingProto(serialized_sharding=M.Serialized(
        type_name="xla::ifrt::HloSharding", data=inner.SerializeToString()))


def spec(dims, sharding, kind="KIND_F32"):
    return M.ArraySpecProto(dtype=M.DTypeProto(kind=M.DTypeProto.Kind.Value(kind)),
                            shape=M.ShapeProto(dims=dims), sharding=sharding)


def ok(response, kind):
    assert status_of(response) == (0, ""), status_of(response)
    assert response.WhichOneof("response") == kind
    return getattr(response, kind)


class Host:
    """Host buffers of one raw session: ``put`` stores, ``get`` copies an array out."""

    def __init__(self, channel, session):
        self.channel, self.session, self.next = channel, session, itertools.count(10_000)

    def put(self, values, sharding, handle=0):
        buffer = next(self.next)
        store(self.channel, self.session.id, buffer, np.ascontiguousarray(values).tobytes())
        request = M.MakeArrayFromHostBufferRequest(
            dtype=M.DTypeProto(kind=M.DTypeProto.Kind.Value("KIND_F32")),
            shape=M.ShapeProto(dims=values.shape), sharding=sharding, host_buffer_handle=buffer)
        if handle:
            request.array_handle = handle
        return ok(self.session.call("make_array_from_host_buffer_request", request),
                  "make_array_from_host_buffer_response").array_handle

    def get(self, handle, shape):
        buffer = next(self.next)
        ok(self.session.call("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
            array_handle=handle, host_buffer_handle=buffer)), "copy_to_host_buffer_response")
        data = lookup(self.channel, self.session.id, buffer)
        return np.frombuffer(data, np.float32).reshape(shape)


def test_disassemble_assemble_copy_reshard_and_delete(channel, session):
    host = Host(channel, session)
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    rows = hlo_sharding([0, 1], [2, 1])
    a = host.put(x, rows)
    np.testing.assert_array_equal(host.get(a, (4, 2)), x)
    pieces = ok(session.call("disassemble_into_single_device_arrays_request",
                             M.DisassembleIntoSingleDeviceArraysRequest(array_handle=a)),
                "disassemble_into_single_device_arrays_response").array_handles
    np.testing.assert_array_equal(host.get(pieces[1], (2, 2)), x[2:])
    assembled = ok(session.call("assemble_array_from_single_device_arrays_request",
                                M.AssembleArrayFromSingleDeviceArraysRequest(
                                    shape=M.ShapeProto(dims=[4, 2]), sharding=rows,
                                    single_device_array_handles=pieces, copy_semantics=1)),
                   "assemble_array_from_single_device_arrays_response").array_handle
    np.testing.assert_array_equal(host.get(assembled, (4, 2)), x)
    copied, = ok(session.call("copy_arrays_request", M.CopyArraysRequest(
        array_handles=[a], device_ids=[1, 0], copy_semantics=1)), "copy_arrays_response").array_handles
    np.testing.assert_array_equal(host.get(copied, (4, 2)), x)
    resharded, = ok(session.call("reshard_arrays_request", M.ReshardArraysRequest(
        array_handles=[a], array_specs=[spec([4, 2], hlo_sharding([0, 1], []))], copy_semantics=1)),
        "reshard_arrays_response").array_handles
    np.testing.assert_array_equal(host.get(resharded, (4, 2)), x)
    future = ok(session.call("delete_array_request", M.DeleteArrayRequest(array_handle=[a])),
                "delete_array_response").deletion_future_handle
    ok(session.call("check_future_request", M.CheckFutureRequest(future_handle=future)),
       "check_future_response")
    assert ok(session.call("is_array_deleted_request", M.IsArrayDeletedRequest(array_handle=a)),
              "is_array_deleted_response").deleted
    code, _ = status_of(session.call("check_future_request", M.CheckFutureRequest(
        future_handle=future)))
    assert code == NOT_FOUND  # each future is checked once


def test_error_arrays_carry_their_error(channel, session):
    error = M.StatusProto(code=9, message="made to fail")
    handle, = ok(session.call("make_error_arrays_request", M.MakeErrorArraysRequest(
        error=error, array_specs=[spec([3], single_device_sharding())])),
        "make_error_arrays_response").array_handles
    code, message = status_of(session.call("check_value_ready_request",
                                           M.CheckValueReadyRequest(value_handles=[handle])))
    assert (code, message) == (9, "made to fail")


ADD_ONE = """module @add_one { func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %c = stablehlo.constant dense<1.0> : tensor<4xf32>
    %0 = stablehlo.add %a, %c : tensor<4xf32>
    return %0 : tensor<4xf32> } }"""


def test_compile_metadata_execute_and_queries(channel, session):
    host = Host(channel, session)
    compiled = ok(session.call("compile_request", compile_request(ADD_ONE, (1,))), "compile_response")
    assert list(compiled.device_ids) == [1] and compiled.num_devices == 1
    ok(session.call("check_future_request", M.CheckFutureRequest(
        future_handle=compiled.ready_future_handle)), "check_future_response")
    exe = compiled.loaded_executable_handle
    donating = ok(session.call("compile_request", compile_request(
        ADD_ONE.replace("%a: tensor<4xf32>)", "%a: tensor<4xf32> {jax.buffer_donor = true})"),
        (1,))), "compile_response").loaded_executable_handle
    donated = ok(session.call("loaded_executable_metadata_request", M.LoadedExecutableMetadataRequest(
        loaded_executable_handle=donating)), "loaded_executable_metadata_response")
    assert list(donated.donated_input_indices.donated_input_indices) == [0]
    meta = ok(session.call("loaded_executable_metadata_request", M.LoadedExecutableMetadataRequest(
        loaded_executable_handle=exe)), "loaded_executable_metadata_response")
    assert len(meta.output_shardings.shardings) == 1
    assert list(meta.output_memory_kinds.memory_kind_lists[0].memory_kinds) == ["device"]
    assert meta.HasField("donated_input_indices")
    x = np.arange(4, dtype=np.float32)
    a = host.put(x, single_device_sharding(1))
    run = ok(session.call("loaded_executable_execute_request", M.LoadedExecutableExecuteRequest(
        loaded_executable_handle=exe, args_handles=[a],
        execute_options=M.ExecuteOptionsProto(fill_status=True))),
        "loaded_executable_execute_response")
    ok(session.call("loaded_executable_fetch_execute_result_request",
                    M.LoadedExecutableFetchExecuteResultRequest(result_status_handle=run.status_handle)),
       "loaded_executable_fetch_execute_result_response")
    output, = run.outputs
    assert list(output.shape.dims) == [4]
    np.testing.assert_array_equal(host.get(output.array_handle, (4,)), x + 1)
    # client-minted handles: the answer carries no status handle
    minted = ok(session.call("loaded_executable_execute_request", M.LoadedExecutableExecuteRequest(
        loaded_executable_handle=exe, args_handles=[a], result_array_handle=[4242])),
        "loaded_executable_execute_response")
    assert minted.status_handle == 0
    np.testing.assert_array_equal(host.get(4242, (4,)), x + 1)
    # a wrong argument fails the execute and binds its error to the minted handle
    code, message = status_of(session.call("loaded_executable_execute_request",
                                           M.LoadedExecutableExecuteRequest(
                                               loaded_executable_handle=exe, args_handles=[],
                                               result_array_handle=[4343])))
    assert code == INVALID
    assert status_of(session.call("is_array_deleted_request", M.IsArrayDeletedRequest(
        array_handle=4343))) == (code, message)
    # a result handle already in use is refused before the run: the argument survives
    code, message = status_of(session.call("loaded_executable_execute_request",
                                           M.LoadedExecutableExecuteRequest(
                                               loaded_executable_handle=donating, args_handles=[a],
                                               result_array_handle=[a])))
    assert code == INVALID and "already in use" in message
    np.testing.assert_array_equal(host.get(a, (4,)), x)
    text = ok(session.call("loaded_executable_human_readable_program_text_request",
                           M.LoadedExecutableHumanReadableProgramTextRequest(loaded_executable_handle=exe)),
              "loaded_executable_human_readable_program_text_response")
    # what the compiler made of it, as jax's compiled.as_text() reads it from a PjRt client
    assert text.human_readable_program_text.startswith("HloModule")
    assert " add(" in text.human_readable_program_text
    ok(session.call("loaded_executable_cost_analysis_request", M.LoadedExecutableCostAnalysisRequest(
        loaded_executable_handle=exe)), "loaded_executable_cost_analysis_response")
    mpmd = ok(session.call("loaded_executable_mpmd_metadata_request",
                           M.LoadedExecutableMpmdMetadataRequest(mpmd_loaded_executable_handle=exe)),
              "loaded_executable_mpmd_metadata_response")
    assert "not an MPMD" in mpmd.mpmd_compiled_memory_stats_error.message
    layout = ok(session.call("get_default_layout_request", M.GetDefaultLayoutRequest(
        dtype=M.DTypeProto(kind=M.DTypeProto.Kind.Value("KIND_F32")), dims=[2, 3], device_id=0,
        memory_kind="device")), "get_default_layout_response")
    assert layout.serialized_pjrt_layout == b"{1,0}"
    assignment = ok(session.call("get_default_device_assignment_request",
                                 M.GetDefaultDeviceAssignmentRequest(num_replicas=1, num_partitions=2)),
                    "get_default_device_assignment_response").device_assignment
    assert [list(c.replica_device_ids) for c in assignment.computation_devices] == [[0], [1]]
    code, message = status_of(session.call("loaded_host_callback_poll_request",
                                           M.LoadedHostCallbackPollRequest()))
    assert code == UNIMPLEMENTED and "host callbacks" in message
    ok(session.call("loaded_executable_destruct_request", M.LoadedExecutableDestructRequest(
        loaded_executable_handle=exe)), "loaded_executable_destruct_response")
    code, _ = status_of(session.call("loaded_executable_is_deleted_request",
                                     M.LoadedExecutableIsDeletedRequest(loaded_executable_handle=exe)))
    assert code == NOT_FOUND


TOKENS = """module @tokens { func.func public @main(%t: !stablehlo.token,
        %a: tensor<4xf32> {jax.buffer_donor = true}) -> (tensor<4xf32>, !stablehlo.token) {
    %0 = stablehlo.add %a, %a : tensor<4xf32>
    return %0, %t : tensor<4xf32>, !stablehlo.token } }"""


def test_token_parameters_and_results_are_counted_as_jax_counts_them(channel, session):
    """main's tokens take positions of their own, as jax's PjRt client counts them: any
    array at a token parameter (jax passes a bool[0]), a token-typed result that is ready
    once its run is and holds nothing to read; the metadata has an entry per position."""
    host = Host(channel, session)
    exe = ok(session.call("compile_request", compile_request(TOKENS)),
             "compile_response").loaded_executable_handle
    meta = ok(session.call("loaded_executable_metadata_request", M.LoadedExecutableMetadataRequest(
        loaded_executable_handle=exe)), "loaded_executable_metadata_response")
    assert list(meta.donated_input_indices.donated_input_indices) == [1]
    assert len(meta.parameter_shardings.shardings) == 2
    assert len(meta.output_shardings.shardings) == 2
    assert list(meta.output_memory_kinds.memory_kind_lists[0].memory_kinds) == ["device"] * 2
    assert "token" in meta.parameter_layouts_error.message
    assert "token" in meta.output_layouts_error.message
    x = np.arange(4, dtype=np.float32)
    a, placeholder = host.put(x, single_device_sharding()), host.put(x[:0], single_device_sharding())
    run = ok(session.call("loaded_executable_execute_request", M.LoadedExecutableExecuteRequest(
        loaded_executable_handle=exe, args_handles=[placeholder, a])),
        "loaded_executable_execute_response")
    out, token = run.outputs
    assert token.dtype.kind == M.DTypeProto.Kind.Value("KIND_TOKEN") and list(token.shape.dims) == []
    np.testing.assert_array_equal(host.get(out.array_handle, (4,)), 2 * x)
    assert ok(session.call("is_array_deleted_request", M.IsArrayDeletedRequest(array_handle=a)),
              "is_array_deleted_response").deleted  # donated
    ok(session.call("check_value_ready_request", M.CheckValueReadyRequest(
        value_handles=[token.array_handle])), "check_value_ready_response")
    for kind, request in (
            ("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
                array_handle=token.array_handle, host_buffer_handle=99)),
            ("loaded_executable_execute_request", M.LoadedExecutableExecuteRequest(
                loaded_executable_handle=exe, args_handles=[token.array_handle, token.array_handle])),
            ("loaded_executable_execute_request", M.LoadedExecutableExecuteRequest(
                loaded_executable_handle=exe, args_handles=[out.array_handle]))):
        code, message = status_of(session.call(kind, request))
        assert code == INVALID and ("token" in message or "takes 2 arguments" in message), message
    # the token passed back where main takes one runs the program again; then it is deleted
    again = ok(session.call("loaded_executable_execute_request", M.LoadedExecutableExecuteRequest(
        loaded_executable_handle=exe, args_handles=[token.array_handle, out.array_handle])),
        "loaded_executable_execute_response")
    np.testing.assert_array_equal(host.get(again.outputs[0].array_handle, (4,)), 4 * x)
    ok(session.call("delete_array_request", M.DeleteArrayRequest(array_handle=[token.array_handle])),
       "delete_array_response")
    assert ok(session.call("is_array_deleted_request", M.IsArrayDeletedRequest(
        array_handle=token.array_handle)), "is_array_deleted_response").deleted


def test_compile_options_reach_the_compiler(session):
    """jax's ``compiler_options`` (``env_option_overrides``) are applied by the backend's
    compiler, which refuses one it does not know by name, as jax's own client does."""
    request = compile_request(ADD_ONE)
    options = M.XlaCompileOptionsProto.FromString(request.compile_options.data)
    options.compile_options.env_option_overrides["xla_embed_ir_in_executable"].bool_field = True
    request.compile_options.data = options.SerializeToString()
    ok(session.call("compile_request", request), "compile_response")
    options.compile_options.env_option_overrides["invalid_key"].string_field = "invalid_value"
    request.compile_options.data = options.SerializeToString()
    code, message = status_of(session.call("compile_request", request))
    assert code == INVALID and "No such compile option: 'invalid_key'" in message, message


def test_string_arrays_round_trip(channel, session):
    words = [b"ifrt", b"", b"proxy \xe2\x9c\x93"]
    store(channel, session.id, 77, M.StringArrayContents(strings=words).SerializeToString())
    request = M.MakeArrayFromHostBufferRequest(
        dtype=M.DTypeProto(kind=M.DTypeProto.Kind.Value("KIND_STRING")),
        shape=M.ShapeProto(dims=[3]), sharding=single_device_sharding(), host_buffer_handle=77)
    handle = ok(session.call("make_array_from_host_buffer_request", request),
                "make_array_from_host_buffer_response").array_handle
    ok(session.call("copy_to_host_buffer_request", M.CopyToHostBufferRequest(
        array_handle=handle, host_buffer_handle=78)), "copy_to_host_buffer_response")
    data = lookup(channel, session.id, 78)
    assert list(M.StringArrayContents.FromString(data).strings) == words


def test_a_copy_out_over_the_host_buffer_limit_is_answered_with_the_error(client):
    with proxy.serve(client, max_host_buffer_bytes=64) as small, \
            grpc.insecure_channel(small.address) as ch:
        raw = RawSession(ch)
        store(ch, raw.id, 1, np.zeros(16, np.float32).tobytes())  # 64 bytes: at the limit
        ok(raw.call("make_array_from_host_buffer_request", put_request(1, [16], 50)),
           "make_array_from_host_buffer_response")
        store(ch, raw.id, 2, np.zeros(16, np.float32).tobytes())  # held: the copy cannot fit
        code, message = status_of(raw.call("copy_to_host_buffer_request",
                                           M.CopyToHostBufferRequest(array_handle=50,
                                                                     host_buffer_handle=3)))
        raw.close()
    assert code == EXHAUSTED and "limit of 64" in message


def test_byte_strides_in_and_out(channel, session):
    host = Host(channel, session)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    store(channel, session.id, 90, np.asfortranarray(x).tobytes(order="F"))
    request = put_request(90, [2, 3], 91)
    request.byte_strides.strides.extend([4, 8])  # column-major
    ok(session.call("make_array_from_host_buffer_request", request),
       "make_array_from_host_buffer_response")
    np.testing.assert_array_equal(host.get(91, (2, 3)), x)
    copy = M.CopyToHostBufferRequest(array_handle=91, host_buffer_handle=92)
    copy.byte_strides.strides.extend([4, 8])
    ok(session.call("copy_to_host_buffer_request", copy), "copy_to_host_buffer_response")
    data = lookup(channel, session.id, 92)
    assert data == x.tobytes(order="F")
    request = put_request(93, [2, 3])
    request.byte_strides.strides.extend([4, 80])  # reads past the buffer's end
    store(channel, session.id, 93, x.tobytes())
    code, message = status_of(session.call("make_array_from_host_buffer_request", request))
    assert code == INVALID and "reads 168" in message  # 1*4 + 2*80 + 4


def test_zero_byte_strides_put_a_broadcast(channel, session):
    """A zero byte stride (a broadcast NumPy view) repeats the elements it indexes."""
    host = Host(channel, session)
    row = np.arange(3, dtype=np.float32)
    store(channel, session.id, 95, row.tobytes())
    request = put_request(95, [4, 3], 96)
    request.byte_strides.strides.extend([0, 4])
    ok(session.call("make_array_from_host_buffer_request", request),
       "make_array_from_host_buffer_response")
    np.testing.assert_array_equal(host.get(96, (4, 3)), np.broadcast_to(row, (4, 3)))


def test_a_unix_socket_server(client, tmp_path):
    address = f"unix:{tmp_path}/proxy.sock"
    with proxy.serve(client, address) as running, grpc.insecure_channel(address) as ch:
        assert running.address == address
        raw = RawSession(ch)
        assert [s.id for s in running.sessions()] == [raw.id]
        raw.close()
