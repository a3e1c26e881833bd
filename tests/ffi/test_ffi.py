"""ifrtpy.ffi: XLA FFI handlers of the tests' own (tests/helpers/data/ffi_handlers.cc,
built with g++ against the headers jaxlib ships), registered with register_ffi_target, run from
``jax.ffi.ffi_call`` inside jax programs, on one device and SPMD over 8 through
``shard_map``, on every CPU plugin installed and on the jax backend, against NumPy.

A plugin runs handlers built for its own XLA FFI version or an older one: the C++ handler
(built for jaxlib's headers) is refused by name on plugins with an older XLA, the C ABI
handler (which claims the version of whoever calls it) runs everywhere. The plugins'
XLA FFI versions below were measured by registering probe handlers with each.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import ifrtpy as ifrt
import ffi_library
from cpu_plugins import plugin_params, plugin_path
from pjrt_helpers import REFUSED_AS_TOO_NEW, too_new_for_the_plugin
from ifrtpy.errors import (
    AlreadyExistsError, FailedPreconditionError, IfrtError, InvalidArgumentError,
    NotFoundError, UnimplementedError,
)

jax = pytest.importorskip("jax")
jnp = jax.numpy
P = jax.sharding.PartitionSpec

#: The XLA FFI version each plugin's framework runs (measured with probe handlers).
FRAMEWORK_VERSIONS = {"xla-cpu-pjrt": (0, 2), "fastatomstruct": (0, 3), "lammps": (0, 4)}
TARGETS = ffi_library.TARGETS
TYPED = {k: v for k, v in TARGETS.items() if not k.endswith("Legacy")}


@pytest.fixture(scope="session")
def handlers():
    return ffi_library.load()


@pytest.fixture(scope="module", params=plugin_params())
def plugin(request):
    """(name, a client of 8 devices) for each CPU plugin installed."""
    return request.param, ifrt.get_client("pjrt", plugin=plugin_path(request.param), device_count=8)


def _runs(plugin_name: str, symbol: str) -> bool:
    """Whether the plugin runs the handler: the ABI one always, the C++ one where the
    plugin's XLA FFI is at least jaxlib's headers' version."""
    return symbol == "ScaleAbi" or FRAMEWORK_VERSIONS[plugin_name] >= ffi_library.header_version()


def _scale(target, scale):
    return jax.jit(lambda x: jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(
        x, scale=np.float32(scale)))


def test_each_plugin_reports_its_xla_ffi_version(plugin):
    from ifrtpy._pjrt import _ffi

    name, client = plugin
    assert _ffi.framework_version(client._handle.plugin) == FRAMEWORK_VERSIONS[name]


@pytest.mark.parametrize("symbol", sorted(TYPED))
def test_ffi_call_on_one_device(handlers, plugin, symbol):
    name, client = plugin
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    program = ifrt.HloProgram(_scale(TARGETS[symbol], 2.5).lower(x))
    if not _runs(name, symbol):
        with pytest.raises(FailedPreconditionError, match=r"XLA FFI 0\.\d+.*runs XLA FFI 0\.\d+") as e:
            client.compile(program)
        assert TARGETS[symbol] in str(e.value)
        return
    (out,) = client.compile(program)(ifrt.device_put(x, client.devices()[0]))
    np.testing.assert_array_equal(np.asarray(out), x * np.float32(2.5))


@pytest.mark.parametrize("symbol", sorted(TYPED))
def test_ffi_call_spmd_through_shard_map(handlers, plugin, symbol):
    name, client = plugin
    if not _runs(name, symbol):
        pytest.skip("the plugin's XLA FFI is older than the handler's (see test_ffi_call_on_one_device)")
    mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    sharding = jax.sharding.NamedSharding(mesh, P("x"))

    def body(x):
        y = jax.ffi.ffi_call(TARGETS[symbol], jax.ShapeDtypeStruct(x.shape, x.dtype))(
            x, scale=np.float32(3))
        return y - jax.lax.psum(y, "x")

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")),
                in_shardings=sharding)
    x = np.arange(16, dtype=np.float32)
    lowered = f.lower(x)
    options = ifrt.CompileOptions(devices=ifrt.DeviceList(client.devices()), num_partitions=8)
    if too_new_for_the_plugin(lowered.as_text(), client):
        with pytest.raises(IfrtError, match=REFUSED_AS_TOO_NEW):
            client.compile(ifrt.HloProgram(lowered), options)
        return
    exe = client.compile(ifrt.HloProgram(lowered), options)
    (out,) = exe(ifrt.device_put(x, exe.parameter_shardings()[0]))
    shards = (3 * x).reshape(8, 2)
    np.testing.assert_array_equal(np.asarray(out), (shards - shards.sum(0)).reshape(-1))


@pytest.mark.parametrize("symbol", sorted(TYPED))
def test_an_error_the_handler_returns_is_an_ifrtpy_error(handlers, plugin, symbol):
    name, client = plugin
    if not _runs(name, symbol):
        pytest.skip("the plugin's XLA FFI is older than the handler's")
    x = np.ones(4, np.float32)
    exe = client.compile(ifrt.HloProgram(_scale(TARGETS[symbol], -1).lower(x)))
    with pytest.raises(InvalidArgumentError, match="refuses a negative scale"):
        result = exe.execute([ifrt.device_put(x, client.devices()[0])],
                             ifrt.ExecuteOptions(fill_status=True))
        result.status.result()
        np.asarray(result.outputs[0])


@pytest.mark.parametrize("symbol", sorted(TYPED))
def test_the_jax_backend_runs_registered_handlers(handlers, symbol):
    client = ifrt.get_client("jax")
    x = np.arange(5, dtype=np.float32)
    device = client.devices()[0]
    exe = client.compile(ifrt.HloProgram(_scale(TARGETS[symbol], 4).lower(x)),
                         ifrt.CompileOptions(devices=ifrt.DeviceList([device])))
    (out,) = exe(ifrt.device_put(x, device))
    np.testing.assert_array_equal(np.asarray(out), 4 * x)


def test_an_unregistered_target_is_refused_at_compile_by_name():
    client = ifrt.get_client("pjrt", device_count=2)
    x = np.ones(3, np.float32)
    f = jax.jit(lambda v: jax.ffi.ffi_call("ifrtpy_test_nobody", jax.ShapeDtypeStruct(v.shape, v.dtype))(v))
    with pytest.raises(NotFoundError, match="'ifrtpy_test_nobody'.*register_ffi_target"):
        client.compile(ifrt.HloProgram(f.lower(x)))


def test_registration_errors(handlers):
    other = ifrt.ffi.pycapsule(handlers.ScaleTyped)
    ifrt.ffi.register_ffi_target(TARGETS["ScaleAbi"], ifrt.ffi.pycapsule(handlers.ScaleAbi))  # the same: fine
    with pytest.raises(AlreadyExistsError, match="another handler"):
        ifrt.ffi.register_ffi_target(TARGETS["ScaleAbi"], other)
    with pytest.raises(InvalidArgumentError, match="PyCapsule"):
        ifrt.ffi.register_ffi_target("ifrtpy_test_bad", handlers.ScaleAbi)
    with pytest.raises(InvalidArgumentError, match="'execute'"):
        ifrt.ffi.register_ffi_target("ifrtpy_test_bad", {"prepare": other})
    with pytest.raises(InvalidArgumentError, match="api_version"):
        ifrt.ffi.register_ffi_target("ifrtpy_test_bad", other, api_version=2)
    with pytest.raises(InvalidArgumentError, match="platform"):
        ifrt.ffi.register_ffi_target("ifrtpy_test_bad", other, platform="tpu")
    with pytest.raises(InvalidArgumentError, match="served by ifrtpy"):
        ifrt.ffi.register_ffi_target("xla_ffi_python_cpu_callback", other)
    with pytest.raises(InvalidArgumentError, match="null pointer"):
        ifrt.ffi.pycapsule(ctypes.c_void_p(0))
    data = ctypes.create_string_buffer(64)
    for address in (12345, ctypes.addressof(data)):
        with pytest.raises(InvalidArgumentError, match="not in executable memory"):
            ifrt.ffi.register_ffi_target("ifrtpy_test_bad", ifrt.ffi.pycapsule(address))
    assert "ifrtpy_test_bad" not in ifrt.ffi.registered_targets("cpu")
    assert TARGETS["ScaleAbi"] in ifrt.ffi.registered_targets("cpu")


def test_a_legacy_target_is_refused_by_plugins_and_runs_on_jax(handlers):
    from ifrtpy.builder import Builder

    b = Builder("legacy")
    x = b.parameter((4,), np.float32)
    program = b.build(b.custom_call(TARGETS["DoubleLegacy"], [x], ((4,), np.float32), api_version=2))
    client = ifrt.get_client("pjrt", device_count=2)
    with pytest.raises(UnimplementedError, match="legacy custom call"):
        client.compile(program)
    jax_client = ifrt.get_client("jax")
    device = jax_client.devices()[0]
    exe = jax_client.compile(program, ifrt.CompileOptions(devices=ifrt.DeviceList([device])))
    values = np.array([1.5, -2, 0, 4], np.float32)
    np.testing.assert_array_equal(np.asarray(exe(ifrt.device_put(values, device))[0]), 2 * values)


@pytest.mark.parametrize("name", ["solve", "eigh"])
def test_jaxlib_kernels_are_registered_on_demand(plugin, name):
    plugin_name, client = plugin
    a = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 1.0], [0.5, 1.0, 2.0]], np.float32)
    f = {"solve": lambda m: jnp.linalg.solve(m, jnp.ones(3, m.dtype)),
         "eigh": lambda m: jnp.linalg.eigh(m)[0]}[name]
    program = ifrt.HloProgram(jax.jit(f).lower(a))
    assert any(t.startswith("lapack_") for t in program.custom_call_targets)
    if FRAMEWORK_VERSIONS[plugin_name] < ffi_library.header_version():
        with pytest.raises(FailedPreconditionError, match="jaxlib's kernel 'lapack_.*jnp.linalg"):
            client.compile(program)
        return
    (out,) = client.compile(program)(ifrt.device_put(a, client.devices()[0]))
    want = np.linalg.solve(a, np.ones(3)) if name == "solve" else np.linalg.eigvalsh(a)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


def test_a_refusal_is_raised_again_by_every_compile(handlers):
    client = ifrt.get_client("pjrt", device_count=2)
    from ifrtpy._pjrt import _ffi

    if _ffi.framework_version(client._handle.plugin) >= ffi_library.header_version():
        pytest.skip("the default plugin runs jaxlib's XLA FFI version")
    program = ifrt.HloProgram(_scale(TARGETS["ScaleTyped"], 2).lower(np.ones(2, np.float32)))
    for _ in range(2):
        with pytest.raises(IfrtError, match="is built for XLA FFI"):
            client.compile(program)
