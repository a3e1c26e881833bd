"""The IFRT Proxy server at the protocol level, driven with grpcio directly: its message
table agrees with the installed jaxlib's descriptors; bad versions, headers, messages,
handles and sizes get error statuses (the server goes on serving); per-session limits
answer RESOURCE_EXHAUSTED; unknown custom-call targets are refused at compile."""

import itertools
import queue
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy import proxy  # noqa: E402
from ifrtpy.errors import InvalidArgumentError, PermissionDeniedError  # noqa: E402
from ifrtpy.proxy import fields  # noqa: E402
from ifrtpy.proxy._protocol import messages  # noqa: E402

M = messages()
SERVICE = "/xla.ifrt.proxy.GrpcIfrtService/"
SESSION_HEADER = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
STORE_HEADER = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"
WAIT_S = 60  # a bound on a hang, not a timing assertion
INVALID, NOT_FOUND, EXHAUSTED, UNIMPLEMENTED = 3, 5, 8, 12


def _version(protocol, serdes):
    return M.IfrtProxyVersion(protocol_version=protocol, ifrt_serdes_version_number=serdes)


class RawSession:
    """An IfrtSession stream: ``call(kind, message)`` sends one request, returns its answer."""

    def __init__(self, channel, protocol=25):
        self._requests: queue.Queue = queue.Queue()
        self._ops = itertools.count(1)
        stream = channel.stream_stream(SERVICE + "IfrtSession",
                                       request_serializer=M.IfrtRequest.SerializeToString,
                                       response_deserializer=M.IfrtResponse.FromString)
        header = M.GrpcIfrtSessionMetadata(version=_version(protocol, 3)).SerializeToString()
        self._responses = stream(iter(self._requests.get, None),
                                 metadata=[(SESSION_HEADER, header)])
        self.id = self.call("init_request", M.InitRequest()).init_response.session_id

    def call(self, kind, message):
        request = M.IfrtRequest()
        op_id = next(self._ops)
        request.request_metadata.op_id = op_id
        getattr(request, kind).CopyFrom(message)
        self._requests.put(request)
        response = next(self._responses)
        assert response.response_metadata.op_id == op_id
        return response

    def close(self):
        self._requests.put(None)


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


def store(channel, session_id, handle, data, size=None):
    header = M.GrpcHostBufferStoreMetadata(session_id=session_id, handle=handle,
                                           buffer_size=len(data) if size is None else size)
    call = channel.stream_unary(SERVICE + "HostBufferStore",
                                request_serializer=M.GrpcHostBufferStoreRequest.SerializeToString,
                                response_deserializer=M.GrpcHostBufferStoreResponse.FromString)
    chunks = [M.GrpcHostBufferStoreRequest(data=data[i:i + 1000]) for i in range(0, len(data), 1000)]
    return call(iter(chunks), metadata=[(STORE_HEADER, header.SerializeToString())], timeout=WAIT_S)


def single_device_sharding(device_id=0):
    inner = M.SingleDeviceShardingProto(device_id=device_id).SerializeToString()
    return M.ShardingProto(serialized_sharding=M.Serialized(
        type_name="xla::ifrt::SingleDeviceSharding", data=inner))


def put_request(buffer_handle, dims, array_handle=0):
    request = M.MakeArrayFromHostBufferRequest(
        dtype=M.DTypeProto(kind=M.DTypeProto.Kind.Value("KIND_F32")),
        shape=M.ShapeProto(dims=dims), sharding=single_device_sharding(),
        host_buffer_handle=buffer_handle)
    if array_handle:
        request.array_handle = array_handle
    return request


def status_of(response):
    return response.response_metadata.status.code, response.response_metadata.status.message


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
    lookup = channel.unary_stream(SERVICE + "HostBufferLookup",
                                  request_serializer=M.GrpcHostBufferLookupRequest.SerializeToString,
                                  response_deserializer=M.GrpcHostBufferLookupResponse.FromString)
    data = b"".join(r.data for r in lookup(M.GrpcHostBufferLookupRequest(
        session_id=session.id, handle=2), timeout=WAIT_S))
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
