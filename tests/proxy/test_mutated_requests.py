"""Mutated good requests through a session, on the pjrt and reference backends (hypothesis,
a few hundred examples): each is answered, with an error status of an ifrtpy error where
it fails, and the session serves on. Field values are set to hostile ones (integers at and
beyond their ranges' ends, unknown enum values, grown, shrunk or emptied repeated fields,
changed bytes; serialized shardings, layouts and compile options mutated as the messages
they hold). The examples run in a child process, which prints each before handling it:
one that took the process down fails the test naming the request, not pytest."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

pytest.importorskip("google.protobuf")

import ifrtpy as ifrt  # noqa: E402
from ifrtpy.errors import IfrtError  # noqa: E402

from test_hostile_requests import (  # noqa: E402
    F32, M, ONE_TO_ONE, ROWS, ROWS_VALUES, X, Driver, World, compile_options, compile_request,
    hlo, remap, single, spec,
)


def good_requests(w: World) -> list[tuple[str, Any]]:
    """Good requests of most kinds, to mutate (each names ``w``'s arrays and executable, and
    host buffers 7 and 8, stored for it)."""
    shards = M.MakeArraysFromHostBufferShardsRequest(array_handles=[40])
    entry = shards.specs.add(array_spec=spec([4, 2], hlo(ROWS)))
    for index, buffer in enumerate((7, 8)):
        entry.addressable_shard_indices.add(indices=[index])
        entry.host_buffers.add(dtype=F32, shape=M.ShapeProto(dims=[2, 2]),
                               host_buffer_handle=buffer)
    strided = M.CopyToHostBufferRequest(array_handle=w.rows, host_buffer_handle=50)
    strided.byte_strides.strides.extend([4, 16])
    put = M.MakeArrayFromHostBufferRequest(dtype=F32, shape=M.ShapeProto(dims=[4, 2]),
                                           sharding=hlo(ROWS), host_buffer_handle=7,
                                           array_handle=41)
    put.byte_strides.strides.extend([8, 4])
    return [
        ("make_array_from_host_buffer_request", put),
        ("make_arrays_from_host_buffer_shards_request", shards),
        ("copy_to_host_buffer_request", strided),
        ("make_error_arrays_request", M.MakeErrorArraysRequest(
            error=M.StatusProto(code=9, message="x"), array_specs=[spec([4, 2], hlo(ROWS))])),
        ("assemble_array_from_single_device_arrays_request",
         M.AssembleArrayFromSingleDeviceArraysRequest(
             shape=M.ShapeProto(dims=[8]), sharding=hlo(ROWS),
             single_device_array_handles=[w.x, w.x], copy_semantics=1)),
        ("reshard_arrays_request", M.ReshardArraysRequest(
            array_handles=[w.rows], array_specs=[spec([4, 2], single(1))], copy_semantics=1)),
        ("remap_arrays_request", remap(w, [ONE_TO_ONE])),
        ("copy_arrays_request", M.CopyArraysRequest(array_handles=[w.x], device_ids=[1],
                                                    copy_semantics=1)),
        ("disassemble_into_single_device_arrays_request",
         M.DisassembleIntoSingleDeviceArraysRequest(array_handle=w.rows, copy_semantics=1)),
        ("loaded_executable_execute_request", M.LoadedExecutableExecuteRequest(
            loaded_executable_handle=w.exe, args_handles=[w.x],
            execute_options=M.ExecuteOptionsProto(fill_status=True))),
        ("get_default_layout_request", M.GetDefaultLayoutRequest(
            dtype=F32, dims=[4, 2], device_id=1, memory_kind="device")),
        ("compile_request", compile_request(options=compile_options(1, 2, ((0,), (1,))))),
    ]


#: The messages serialized in ``Serialized.data``, by type name: mutated as messages.
SERIALIZED = {
    "xla::ifrt::HloSharding": "HloShardingProto",
    "xla::ifrt::SingleDeviceSharding": "SingleDeviceShardingProto",
    "xla::ifrt::XlaCompileOptions": "XlaCompileOptionsProto",
    "xla::ifrt::PjRtLayout": "PjRtLayoutProto",
}

#: The range of each protobuf integer type (FieldDescriptor.TYPE_*).
RANGES = {3: (-2**63, 2**63 - 1), 18: (-2**63, 2**63 - 1), 16: (-2**63, 2**63 - 1),
          5: (-2**31, 2**31 - 1), 17: (-2**31, 2**31 - 1), 15: (-2**31, 2**31 - 1),
          14: (-2**31, 2**31 - 1), 4: (0, 2**64 - 1), 6: (0, 2**64 - 1), 13: (0, 2**32 - 1),
          7: (0, 2**32 - 1)}
SPECIAL = (0, 1, 2, 3, -1, -2, 7, 99, 1 << 20, 1 << 31, 1 << 40, 1 << 62, (1 << 63) - 1,
           -(1 << 62), -(1 << 63))


def fields_of(message: Any) -> list[tuple[Any, Any]]:
    """Every (message, scalar field) pair of ``message`` and the messages it holds."""
    found = []
    for field in message.DESCRIPTOR.fields:
        if field.message_type is None:
            found.append((message, field))
        elif field.is_repeated:
            if not field.message_type.GetOptions().map_entry:
                for inner in getattr(message, field.name):
                    found += fields_of(inner)
        elif message.HasField(field.name):
            found += fields_of(getattr(message, field.name))
    return found


def mutate(data: Any, message: Any, count: int) -> None:
    """Set ``count`` scalar fields of ``message`` (drawn from hypothesis ``data``) to hostile
    values: integers at and beyond their ranges' ends, unknown enum values, grown, shrunk or
    emptied repeated fields, changed bytes; a serialized sharding, layout or set of compile
    options is mutated as the message it holds."""
    from hypothesis import strategies as st

    for _ in range(count):
        holder, field = data.draw(st.sampled_from(fields_of(message)))
        name, repeated = field.name, field.is_repeated
        if field.type in RANGES:
            lo, hi = RANGES[field.type]
            value = data.draw(st.sampled_from([v for v in SPECIAL if lo <= v <= hi])
                              | st.integers(lo, hi))
        elif field.type == field.TYPE_BOOL:
            value = data.draw(st.booleans())
        elif field.type == field.TYPE_STRING:
            value = data.draw(st.sampled_from(["", "device", "pinned_host", "nope",
                                               "xla::ifrt::HloSharding", "\x00"]))
        elif field.type == field.TYPE_BYTES:
            current = bytes(getattr(holder, name)) if not repeated else b""
            inner = SERIALIZED.get(getattr(holder, "type_name", ""))
            nested = None
            if inner is not None and data.draw(st.booleans()):
                try:
                    nested = getattr(M, inner).FromString(current)
                except Exception:  # noqa: BLE001 - bytes a former mutation broke
                    pass
            if nested is not None:
                mutate(data, nested, 1)
                value = nested.SerializeToString()
            else:
                at = data.draw(st.integers(0, len(current)))
                value = current[:at] + data.draw(st.binary(max_size=4)) + current[at + 1:]
        else:  # floats and doubles: not read by the server
            continue
        if not repeated:
            setattr(holder, name, value)
            continue
        values = getattr(holder, name)
        how = data.draw(st.sampled_from(["append", "replace", "clear"]))
        if how == "clear" or (how == "replace" and not values):
            del values[:]
        elif how == "replace":
            values[data.draw(st.integers(0, len(values) - 1))] = value
        else:
            values.append(value)


def fuzz(backend: str, examples: int) -> None:
    """``examples`` mutated good requests, each through a fresh session (see the module
    docstring); prints each (its kind and serialized bytes, hex) before handling it."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from ifrtpy.proxy import session as session_module

    session_module.HOST_BUFFER_WAIT_S = 0.01  # a mutated buffer handle names none: no wait
    client = ifrt.get_client(backend, device_count=2)
    first = Driver(client)
    exe = first.ok("compile_request", compile_request()).loaded_executable_handle

    def world() -> World:
        d = Driver(client)
        d.session.executables[exe] = first.session.executables[exe]
        w = World(d, d.put(X, single(0), 1), d.put(ROWS_VALUES, hlo(ROWS), 2), exe)
        for buffer in (7, 8):
            d.session.store_host_buffer(buffer, ROWS_VALUES.tobytes())
        return w

    corpus = [(kind, message.SerializeToString()) for kind, message in good_requests(world())]
    counts: dict[int, int] = {}

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def mutated(data: Any) -> None:
        kind, good = data.draw(st.sampled_from(corpus))
        name = M.IfrtRequest.DESCRIPTOR.fields_by_name[kind].message_type.name
        message = getattr(M, name).FromString(good)
        mutate(data, message, data.draw(st.integers(1, 3)))
        print(kind, message.SerializeToString().hex(), flush=True)
        w = world()
        status = w.driver.call(kind, message).response_metadata.status
        counts[status.code] = counts.get(status.code, 0) + 1
        if status.code:
            error = w.driver.session.errors[-1]
            assert isinstance(error, IfrtError), (kind, repr(error))
        fresh = w.driver.put(X * 3, single(1))
        np.testing.assert_array_equal(w.driver.get(fresh, (4,)), X * 3)

    mutated()
    print("fuzzed", examples, "status codes", sorted(counts.items()), file=sys.stderr)


def test_mutated_requests_are_answered_and_never_take_the_server_down():
    for backend, examples in (("pjrt", 200), ("reference", 100)):
        done = subprocess.run([sys.executable, __file__, "fuzz", backend, str(examples)],
                              capture_output=True, text=True, timeout=600,
                              cwd=pathlib.Path(__file__).parents[2])
        last = done.stdout.strip().splitlines()[-1:] or ["(none)"]
        assert done.returncode == 0 and "fuzzed" in done.stderr, (
            f"{backend}: exit status {done.returncode}; last request handled: {last[0]}\n"
            f"{done.stderr[-3000:]}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["fuzz"]:
        fuzz(sys.argv[2], int(sys.argv[3]))
