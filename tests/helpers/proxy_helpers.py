"""Raw gRPC clients of the IFRT Proxy server, built from the protocol's own messages: a
session stream, host-buffer RPCs and the requests the proxy tests send (tests/proxy)."""

import itertools
import os
import queue
import secrets
import time

import grpc

import ifrtpy_jax_plugin
from ifrtpy.proxy._protocol import messages

M = messages()
SERVICE = "/xla.ifrt.proxy.GrpcIfrtService/"
SESSION_HEADER = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
STORE_HEADER = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"
WAIT_S = 60  # a bound on a hang, not a timing assertion
INVALID, NOT_FOUND, EXHAUSTED, FAILED_PRECONDITION, UNIMPLEMENTED = 3, 5, 8, 9, 12


def version(protocol, serdes):
    return M.IfrtProxyVersion(protocol_version=protocol, ifrt_serdes_version_number=serdes)


def session_header(protocol=25, transfer_directory=None):
    """A serialized GrpcIfrtSessionMetadata; ``transfer_directory`` names the session's
    directory for puts through files, as ifrtpy_jax_plugin does."""
    metadata = M.GrpcIfrtSessionMetadata(version=version(protocol, 3))
    if transfer_directory is not None:
        metadata.initialization_data.attributes[ifrtpy_jax_plugin.TRANSFER_KEY].string_value = (
            transfer_directory.encode())
    return metadata.SerializeToString()


class RawSession:
    """An IfrtSession stream: ``call(kind, message)`` sends one request, returns its answer."""

    def __init__(self, channel, protocol=25, transfer_directory=None, timeout=WAIT_S):
        self._requests: queue.Queue = queue.Queue()
        self._ops = itertools.count(1)
        stream = channel.stream_stream(SERVICE + "IfrtSession",
                                       request_serializer=M.IfrtRequest.SerializeToString,
                                       response_deserializer=M.IfrtResponse.FromString)
        header = session_header(protocol, transfer_directory)
        # the deadline turns a request the server never answers into a failure, not a hang
        self._responses = stream(iter(self._requests.get, None),
                                 metadata=[(SESSION_HEADER, header)], timeout=timeout)
        self.id = self.call("init_request", M.InitRequest()).init_response.session_id

    def send(self, kind, message):
        """Send one request without waiting for its answer; its op_id."""
        request = M.IfrtRequest()
        op_id = next(self._ops)
        request.request_metadata.op_id = op_id
        getattr(request, kind).CopyFrom(message)
        self._requests.put(request)
        return op_id

    def receive(self):
        return next(self._responses)

    def call(self, kind, message):
        op_id = self.send(kind, message)
        response = self.receive()
        assert response.response_metadata.op_id == op_id
        return response

    def close(self):
        self._requests.put(None)

    def cancel(self):
        self._responses.cancel()


def refused_session(channel):
    """Open a session the server refuses: (the status answering its InitRequest, the
    details of the RpcError that ends the stream)."""
    stream = channel.stream_stream(SERVICE + "IfrtSession",
                                   request_serializer=M.IfrtRequest.SerializeToString,
                                   response_deserializer=M.IfrtResponse.FromString)
    init = M.IfrtRequest(init_request=M.InitRequest())
    init.request_metadata.op_id = 1
    responses = stream(iter([init]), metadata=[(SESSION_HEADER, session_header())],
                       timeout=WAIT_S)
    answer = next(responses)
    assert answer.response_metadata.op_id == 1
    details = raises_code(grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: list(responses))
    return status_of(answer), details


def store(channel, session_id, handle, data, size=None, piece=1000):
    header = M.GrpcHostBufferStoreMetadata(session_id=session_id, handle=handle,
                                           buffer_size=len(data) if size is None else size)
    call = channel.stream_unary(SERVICE + "HostBufferStore",
                                request_serializer=M.GrpcHostBufferStoreRequest.SerializeToString,
                                response_deserializer=M.GrpcHostBufferStoreResponse.FromString)
    chunks = [M.GrpcHostBufferStoreRequest(data=data[i:i + piece])
              for i in range(0, len(data), piece)]
    return call(iter(chunks), metadata=[(STORE_HEADER, header.SerializeToString())], timeout=WAIT_S)


def lookup(channel, session_id, handle):
    """The bytes of host buffer ``handle`` (HostBufferLookup)."""
    call = channel.unary_stream(SERVICE + "HostBufferLookup",
                                request_serializer=M.GrpcHostBufferLookupRequest.SerializeToString,
                                response_deserializer=M.GrpcHostBufferLookupResponse.FromString)
    return b"".join(r.data for r in call(M.GrpcHostBufferLookupRequest(
        session_id=session_id, handle=handle), timeout=WAIT_S))


def delete(channel, session_id, handle):
    call = channel.unary_unary(SERVICE + "HostBufferDelete",
                               request_serializer=M.GrpcHostBufferDeleteRequest.SerializeToString,
                               response_deserializer=M.GrpcHostBufferDeleteResponse.FromString)
    return call(M.GrpcHostBufferDeleteRequest(session_id=session_id, handle=handle),
                timeout=WAIT_S)


def read_from_disk(channel, session_id, handle, size):
    call = channel.unary_unary(
        SERVICE + "HostBufferReadFromDisk",
        request_serializer=M.GrpcHostBufferReadFromDiskRequest.SerializeToString,
        response_deserializer=M.GrpcHostBufferReadFromDiskResponse.FromString)
    request = M.GrpcHostBufferReadFromDiskRequest()
    request.metadata.session_id, request.metadata.handle = session_id, handle
    request.metadata.buffer_size = size
    return call(request, timeout=WAIT_S)


def client_directory(address):
    """A directory for puts through files in the shared directory of the server at
    ``address``, made as ifrtpy_jax_plugin makes one: (its path, its name)."""
    name = f"client-{os.getpid()}-{secrets.token_hex(8)}"
    path = os.path.join(ifrtpy_jax_plugin.shared_directory(address), name)
    os.mkdir(path, 0o700)
    return path, name


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


def compile_request(text, device_ids=(0,)):
    options = M.XlaCompileOptionsProto()
    build = options.compile_options.executable_build_options
    build.num_replicas, build.num_partitions = 1, len(device_ids)
    build.device_assignment.replica_count, build.device_assignment.computation_count = 1, len(device_ids)
    for i in device_ids:
        build.device_assignment.computation_devices.add(replica_device_ids=[i])
    return M.CompileRequest(
        program=M.Serialized(type_name="xla::ifrt::XlaProgram", data=text.encode()),
        compile_options=M.Serialized(type_name="xla::ifrt::XlaCompileOptions",
                                     data=options.SerializeToString()))


def raises_code(code, fn, *args, **kwargs):
    """The details of the RpcError ``fn(*args, **kwargs)`` raises, checked to be ``code``."""
    try:
        fn(*args, **kwargs)
    except grpc.RpcError as error:
        assert error.code() == code, (error.code(), error.details())
        return error.details()
    raise AssertionError(f"no RpcError; expected {code}")


class Delegating:
    """A Client, executable or array that forwards everything to ``inner`` (a test backend
    made by changing one method of a real one)."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __repr__(self):
        return f"<{type(self).__name__} of {self._inner!r}>"


class BlockingExecutable(Delegating):
    """Runs as a synchronous backend does: ``execute`` returns once the outputs are ready."""

    def execute(self, *args, **kwargs):
        result = self._inner.execute(*args, **kwargs)
        for output in result.outputs:
            output.ready_future().result()
        return result


class SyncClient(Delegating):
    """A Client whose executables block in ``execute``, counting its compiles."""

    def __init__(self, inner):
        super().__init__(inner)
        self.compiles = 0

    def compile(self, *args, **kwargs):
        self.compiles += 1
        return BlockingExecutable(self._inner.compile(*args, **kwargs))


#: f32[4] -> f32[4], adding one
ADD_ONE = """module @add_one { func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %c = stablehlo.constant dense<1.0> : tensor<4xf32>
    %0 = stablehlo.add %a, %c : tensor<4xf32>
    return %0 : tensor<4xf32> } }"""


def wait_for(predicate, what):
    """Poll ``predicate`` until it holds; a failure naming ``what`` after WAIT_S."""
    deadline = time.monotonic() + WAIT_S  # a bound on a hang, not a timing assertion
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def put_values(channel, session, values, handle, device_id=0):
    """Put the NumPy array ``values`` on a device as array ``handle`` (store, then
    MakeArrayFromHostBuffer); the answer's status."""
    import numpy as np

    store(channel, session.id, handle, np.ascontiguousarray(values).tobytes())
    request = put_request(handle, values.shape, handle)
    request.sharding.CopyFrom(single_device_sharding(device_id))
    request.dtype.kind = M.DTypeProto.Kind.Value(
        {np.dtype(np.float32): "KIND_F32", np.dtype(np.int32): "KIND_S32"}[values.dtype])
    return status_of(session.call("make_array_from_host_buffer_request", request))


def execute_request(executable, args, result_handle=0):
    request = M.LoadedExecutableExecuteRequest(
        loaded_executable_handle=executable, args_handles=args,
        execute_options=M.ExecuteOptionsProto(fill_status=True))
    if result_handle:
        request.result_array_handle.append(result_handle)
    return request


def sync_pjrt_client(**options):
    """``serve --backend proxy_helpers:sync_pjrt_client``: the PjRt client, its execute
    holding the caller until the outputs are ready, as a plugin that runs a program on
    the calling thread does."""
    import ifrtpy as ifrt

    ifrt.Client.register(SyncClient)  # it is one, by delegation
    return SyncClient(ifrt.get_client("pjrt", **options))
