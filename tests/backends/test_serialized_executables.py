"""The form both backends serialize executables in (``ifrtpy.backends.serialized``):
round trips, and bytes that are not one, or are cut short, refused with
InvalidArgumentError on every backend."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.backends import serialized
from ifrtpy.errors import InvalidArgumentError

MAGIC = b"TEST-EXECUTABLE-1\n"
PROGRAM = """
module @add_one {
  func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.constant dense<1.000000e+00> : tensor<4xf32>
    %1 = stablehlo.add %arg0, %0 : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}
"""


@pytest.mark.parametrize("ids,payload", [([0, 3], b"\x00plugin bytes"), (None, b"")])
def test_round_trip(ids, payload):
    data = serialized.pack(MAGIC, PROGRAM, ids, payload)
    assert serialized.unpack(MAGIC, data, "test executable") == (PROGRAM, ids, payload)


def test_other_bytes_are_not_one():
    with pytest.raises(InvalidArgumentError, match="not a serialized test executable"):
        serialized.unpack(MAGIC, b"IFRTPY-OTHER-1\n" + bytes(16), "test executable")


def test_any_changed_byte_is_refused():
    data = serialized.pack(MAGIC, PROGRAM, [0], b"payload")
    for position in range(len(MAGIC), len(data)):
        changed = bytearray(data)
        changed[position] ^= 0x01
        with pytest.raises(InvalidArgumentError, match="corrupt serialized executable"):
            serialized.unpack(MAGIC, bytes(changed), "test executable")


def test_every_cut_into_the_header_is_refused():
    data = serialized.pack(MAGIC, PROGRAM, [0], b"")
    for cut in range(len(MAGIC), len(data)):
        with pytest.raises(InvalidArgumentError, match="corrupt serialized executable"):
            serialized.unpack(MAGIC, data[:cut], "test executable")


@pytest.mark.parametrize("header", [b"[1, 2]", b'{"devices": null}', b"\xff\xfe"])
def test_a_header_of_the_wrong_form_is_refused(header):
    size = struct.pack("<Q", len(header))
    data = MAGIC + size + hashlib.sha256(size + header).digest() + header
    with pytest.raises(InvalidArgumentError, match="corrupt serialized executable: (ValueError|KeyError|TypeError|UnicodeDecodeError|JSONDecodeError)"):
        serialized.unpack(MAGIC, data, "test executable")


@pytest.mark.parametrize("backend", ["pjrt", "reference"])
def test_backends_refuse_a_cut_header(backend):
    client = ifrt.get_client(backend, device_count=1)
    executable = client.compile(ifrt.HloProgram(PROGRAM))
    data = executable.serialize()
    magic_end = data.index(b"\n") + 1
    (size,) = struct.unpack_from("<Q", data, magic_end)
    for cut in (magic_end + 4, magic_end + 8 + size - 1):
        with pytest.raises(InvalidArgumentError, match="corrupt serialized executable"):
            client.deserialize_executable(data[:cut])
    again = client.deserialize_executable(data)
    x = np.arange(4, dtype=np.float32)
    [out] = again(client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(client.devices()[0])))
    np.testing.assert_array_equal(np.asarray(out), x + 1)
