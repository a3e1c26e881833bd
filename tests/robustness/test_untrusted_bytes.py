"""Untrusted bytes never reach jaxlib's bytecode reader or the plugin's deserializer unchecked.

Each case runs in a subprocess: before the fix these inputs aborted the process
(SIGABRT) or corrupted its heap, so a clean exit with the expected error is the test.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import ifrtpy as ifrt
from ifrtpy.backends import serialized
from ifrtpy.backends.pjrt import seal
from ifrtpy.errors import InvalidArgumentError
from pjrt_helpers import run_python

HELPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")

ADD_ONE = """
func.func public @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<8xf32>
  %y = stablehlo.add %x, %one : tensor<8xf32>
  return %y : tensor<8xf32>
}"""


@pytest.mark.parametrize("position,value", [(200, 215), (52, 233)], ids=["abort", "heap"])
def test_a_portable_artifact_with_a_changed_byte_is_refused(position, value):
    done = run_python(f"""
        import ifrtpy as ifrt
        art, _ = ifrt.HloProgram({ADD_ONE!r}).serialize_for((1, 13, 3))
        b = bytearray(art)
        b[{position}] = {value}
        try:
            ifrt.HloProgram(bytes(b))
        except ifrt.errors.InvalidArgumentError as e:
            print("refused:", e)
        import gc; gc.collect()
        # the process is intact: it still reads and runs programs
        import numpy as np
        c = ifrt.get_client(device_count=1)
        x = np.arange(8, dtype=np.float32)
        [y] = c.compile(ifrt.HloProgram(art))(c.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(c.devices()[0])))
        assert (np.asarray(y) == x + 1).all()
        print("intact")
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: not a valid program: program bytes" in done.stdout
    assert "intact" in done.stdout


def test_the_corrupted_plugin_payload_is_refused_by_every_public_path(tmp_path):
    # ifrtpy._pjrt hands serialized executables to the plugin unchecked; the PjRt backend's
    # seal (ifrtpy.backends.pjrt.seal) keeps these bytes, on which the plugin aborts, from it:
    # given bare, inside a well-formed envelope, and as a compilation cache entry.
    payload = os.path.join(HELPERS, "data", "corrupt_executable_payload.b64")
    done = run_python(f"""
        import base64, os, warnings
        import numpy as np
        import ifrtpy as ifrt
        from ifrtpy.backends import serialized
        c = ifrt.get_client("pjrt", device_count=8)
        payload = base64.b64decode(open({payload!r}).read())
        program = ifrt.HloProgram({ADD_ONE!r})
        data = c.compile(program).serialize()
        magic = data[:data.index(b"\\n") + 1]
        text, ids, _ = serialized.unpack(magic, data, "executable")
        for call in (lambda: c.deserialize_executable(payload),
                     lambda: c.deserialize_executable(serialized.pack(magic, text, ids, payload))):
            try:
                call()
            except ifrt.errors.InvalidArgumentError as e:
                print("refused:", e)
        cache = {str(tmp_path / "cache")!r}
        options = ifrt.CompileOptions(compilation_cache_dir=cache)
        c.compile(program, options)
        [name] = os.listdir(cache)
        path = os.path.join(cache, name)
        head = open(path, "rb").read().split(b"\\n", 2)
        open(path, "wb").write(head[0] + b"\\n" + head[1] + b"\\n" + payload)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exe = ifrt.get_client("pjrt", device_count=8).compile(program, options)
        print("cache:", *[str(w.message) for w in caught])
        x = np.arange(8, dtype=np.float32)
        [y] = exe(ifrt.device_put(x, exe.client.devices()[0]))
        assert (np.asarray(y) == x + 1).all()
        print("intact")
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: not a serialized ifrtpy executable" in done.stdout, done.stdout
    assert "refused: not a serialized executable written by ifrtpy" in done.stdout, done.stdout
    assert "discarded and the program compiled again: not a serialized executable written" \
        in done.stdout, done.stdout
    assert "intact" in done.stdout


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client(device_count=1)


@pytest.fixture(scope="module")
def data(client):
    """ADD_ONE, serialized by the PjRt backend: the plugin's sealed bytes in an envelope."""
    return client.compile(ifrt.HloProgram(ADD_ONE)).serialize()


def _magic(data):
    return data[:data.index(b"\n") + 1]


def _sealed(data):
    """The sealed plugin bytes ``data`` carries."""
    return serialized.unpack(_magic(data), data, "executable")[2]


def _carrying(data, sealed):
    """``data``'s envelope (checksum made anew) carrying ``sealed`` instead: only the seal
    stands between those bytes and the plugin."""
    text, ids, _ = serialized.unpack(_magic(data), data, "executable")
    return serialized.pack(_magic(data), text, ids, sealed)


def _payload(client, sealed):
    return seal.unseal(seal.plugin_identity(client._handle), sealed)


def test_sealed_bytes_round_trip(client, data):
    sealed = _sealed(data)
    assert sealed.startswith(seal.MAGIC)
    loaded = client.deserialize_executable(_carrying(data, sealed))
    x = np.arange(8, dtype=np.float32)
    [y] = loaded(ifrt.device_put(x, client.devices()[0]))
    np.testing.assert_array_equal(np.asarray(y), x + 1)


def test_any_changed_or_missing_byte_of_the_payload_is_refused(client, data):
    sealed = _sealed(data)
    start = len(sealed) - len(_payload(client, sealed))
    for position in (start, start + 1, (start + len(sealed)) // 2, len(sealed) - 1):
        changed = bytearray(sealed)
        changed[position] ^= 0x40
        with pytest.raises(InvalidArgumentError, match="checksum does not match"):
            client.deserialize_executable(_carrying(data, bytes(changed)))
    for cut in (len(seal.MAGIC) + 2, start - 1, len(sealed) - 1):
        with pytest.raises(InvalidArgumentError, match="corrupt serialized executable"):
            client.deserialize_executable(_carrying(data, sealed[:cut]))


def test_bytes_sealed_for_another_plugin_are_refused(client, data):
    other = seal.seal(b"('xla_cpu_pjrt.so', 1, (0, 99))", _payload(client, _sealed(data)))
    with pytest.raises(InvalidArgumentError, match="another PJRT plugin"):
        client.deserialize_executable(_carrying(data, other))


def test_raw_plugin_bytes_are_refused(client, data):
    payload = _payload(client, _sealed(data))
    with pytest.raises(InvalidArgumentError, match="not a serialized executable written by ifrtpy"):
        client.deserialize_executable(_carrying(data, payload))
    with pytest.raises(InvalidArgumentError, match="not a serialized ifrtpy executable"):
        client.deserialize_executable(payload)


@pytest.mark.parametrize("value", [None, 3, "text"])
def test_what_is_not_bytes_is_refused(client, value):
    with pytest.raises(InvalidArgumentError, match="a serialized executable is bytes"):
        client.deserialize_executable(value)
    with pytest.raises(InvalidArgumentError, match="a serialized executable is bytes"):
        seal.deserialize_and_load(client._handle, value)
