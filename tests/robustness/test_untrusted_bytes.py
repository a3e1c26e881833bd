"""Untrusted bytes never reach jaxlib's bytecode reader or the plugin's deserializer unchecked.

Each case runs in a subprocess: before the fix these inputs aborted the process
(SIGABRT) or corrupted its heap, so a clean exit with the expected error is the test.
"""

from __future__ import annotations

import os

import pytest

import ifrtpy as ifrt
from ifrtpy._pjrt import _seal
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


def test_the_corrupted_plugin_payload_is_refused_by_the_pjrt_layer():
    payload = os.path.join(HELPERS, "data", "corrupt_executable_payload.b64")
    done = run_python(f"""
        import base64
        import ifrtpy as ifrt
        from ifrtpy import _pjrt
        c = ifrt.get_client("pjrt", device_count=8)
        payload = base64.b64decode(open({payload!r}).read())
        for call in (lambda: _pjrt.deserialize_and_load(c._handle, payload),
                     lambda: c.deserialize_executable(payload)):
            try:
                call()
            except ifrt.errors.InvalidArgumentError as e:
                print("refused:", e)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("refused: not a serialized") == 2


@pytest.fixture(scope="module")
def client():
    return ifrt.get_client(device_count=1)


@pytest.fixture(scope="module")
def sealed(client):
    return client.compile(ifrt.HloProgram(ADD_ONE))._handle.serialize()


def test_sealed_bytes_round_trip(client, sealed):
    from ifrtpy import _pjrt

    handle = _pjrt.deserialize_and_load(client._handle, sealed)
    assert handle.name == client.compile(ifrt.HloProgram(ADD_ONE))._handle.name


def test_any_changed_or_missing_byte_of_the_payload_is_refused(client, sealed):
    from ifrtpy import _pjrt

    start = len(sealed) - len(_seal.unseal(_pjrt.plugin_identity(client._handle), sealed))
    for position in (start, start + 1, (start + len(sealed)) // 2, len(sealed) - 1):
        changed = bytearray(sealed)
        changed[position] ^= 0x40
        with pytest.raises(InvalidArgumentError, match="checksum does not match"):
            _pjrt.deserialize_and_load(client._handle, bytes(changed))
    for cut in (len(_seal.MAGIC) + 2, start - 1, len(sealed) - 1):
        with pytest.raises(InvalidArgumentError, match="corrupt serialized executable"):
            _pjrt.deserialize_and_load(client._handle, sealed[:cut])


def test_bytes_sealed_for_another_plugin_are_refused(client, sealed):
    from ifrtpy import _pjrt

    payload = _seal.unseal(_pjrt.plugin_identity(client._handle), sealed)
    other = _seal.seal(b"('xla_cpu_pjrt.so', 1, (0, 99))", payload)
    with pytest.raises(InvalidArgumentError, match="another PJRT plugin"):
        _pjrt.deserialize_and_load(client._handle, other)


def test_raw_plugin_bytes_are_refused(client, sealed):
    from ifrtpy import _pjrt

    payload = _seal.unseal(_pjrt.plugin_identity(client._handle), sealed)
    with pytest.raises(InvalidArgumentError, match="not a serialized executable written by ifrtpy"):
        _pjrt.deserialize_and_load(client._handle, payload)


def test_the_converting_child_ignores_a_package_in_the_working_directory(tmp_path):
    # `python -c` puts the working directory first on sys.path: a package named ifrtpy
    # there must not be what converts (or replaces) the program.
    fake = tmp_path / "cwd" / "ifrtpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import sys\nsys.stdout.write('func.func @main() -> () { return }')\nsys.exit(0)\n")
    script = tmp_path / "convert.py"
    script.write_text(
        "import ifrtpy as ifrt\n"
        f"art, _ = ifrt.HloProgram({ADD_ONE!r}).serialize_for((1, 13, 3))\n"
        "print([str(p) for p in ifrt.HloProgram(art).parameters])\n")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path / "cwd",
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr
    assert "f32[8]" in done.stdout, done.stdout
