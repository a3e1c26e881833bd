"""Zero-copy interop on a CUDA GPU: ifrtpy <-> jax, torch, cupy through DLPack.

Self-contained: finds the CUDA PJRT plugin (``xla_cuda_plugin.so`` inside the installed
``jax_plugins`` package, located with importlib), makes an ifrtpy client on it, and
checks that

* a CUDA ifrtpy array's DLPack capsules say kDLCUDA and the device's local hardware id,
* it goes to jax on the same GPU and back with no copy (equal device addresses),
* torch and cupy take it (and give theirs back) with no copy, where installed,
* NumPy gathers it by copy and refuses ``copy=False``; pinned host memory is a kDLCUDAHost
  view,

printing one PASS/FAIL line per check (a failing check does not stop the others), then
figures. Exits 1 if a check failed, 2 if no CUDA plugin was found.

    python benchmarks/gpu/check_interop.py
"""

import importlib.util
import os
import pkgutil
import sys
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # jax shares the GPU
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

KDLCUDA, KDLCUDAHOST = 2, 3
MiB = 1 << 20
results = []


def check(name):
    """Run the decorated function now as one check: PASS with its return text, or FAIL
    with the exception (the traceback's last line), never raising."""
    def run(fn):
        start = time.perf_counter()
        try:
            detail = fn()
            results.append(True)
            print(f"PASS {name}: {detail or ''} ({time.perf_counter() - start:.2f}s)", flush=True)
        except Exception as e:  # one failing check must not hide the others
            results.append(False)
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {name}: {type(e).__name__}: {e} (line {where.lineno})", flush=True)
        return fn
    return run


def find_cuda_plugin():
    """Path of xla_cuda_plugin.so in an installed jax_plugins package, or None."""
    spec = importlib.util.find_spec("jax_plugins")
    if spec is None or not spec.submodule_search_locations:
        return None
    for module in pkgutil.iter_modules(list(spec.submodule_search_locations)):
        sub = importlib.util.find_spec(f"jax_plugins.{module.name}")
        if sub is None or not sub.submodule_search_locations:
            continue
        for folder in sub.submodule_search_locations:
            path = os.path.join(folder, "xla_cuda_plugin.so")
            if os.path.isfile(path):
                return path
    return None


def main():
    plugin = find_cuda_plugin()
    if plugin is None:
        print("FAIL find-plugin: no xla_cuda_plugin.so in any installed jax_plugins package "
              "(install jax-cuda13-pjrt or jax-cuda12-pjrt); no CUDA check can run", flush=True)
        return 2
    print(f"PASS find-plugin: {plugin}", flush=True)

    import numpy as np

    import ifrtpy as ifrt
    from ifrtpy._pjrt import _dlpack
    from ifrtpy.backends.pjrt.client import create_client

    state = {}

    @check("ifrtpy-client")
    def _():
        try:
            state["client"] = create_client(plugin, options={"preallocate": False, "memory_fraction": 0.3})
        except ifrt.errors.IfrtError:
            state["client"] = create_client(plugin)
        client = state["client"]
        assert client.platform_name == "cuda", client.platform_name
        return f"{client!r}, local hardware ids {[d.local_hardware_id for d in client.devices()]}"

    client = state.get("client")
    if client is None:
        return 1
    device = client.devices()[-1]  # the last GPU: a non-zero id where there are several
    x = np.arange(16 * MiB // 4, dtype=np.float32)  # 16 MiB
    a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(device))
    a.block_until_ready()
    pointer = a.unsafe_buffer_pointer()
    hw = device.local_hardware_id

    @check("dlpack-device")
    def _():
        assert a.__dlpack_device__() == (KDLCUDA, hw), (a.__dlpack_device__(), hw)
        for d in client.devices():
            b = client.make_array_from_host_buffer(x[:16], ifrt.SingleDeviceSharding(d))
            for versioned in (None, (1, 0)):
                info = _dlpack.capsule_info(b.__dlpack__(stream=1, max_version=versioned))
                assert info[:2] == (KDLCUDA, d.local_hardware_id), (info, d.local_hardware_id)
        return f"kDLCUDA with local hardware ids of {len(client.devices())} device(s)"

    @check("numpy-copies")
    def _():
        np.testing.assert_array_equal(np.asarray(a), x)
        try:
            np.array(a, copy=False)
        except ValueError:
            return "np.asarray gathers; copy=False refused"
        raise AssertionError("np.array(copy=False) of device memory did not refuse")

    @check("numpy-into-gpu-copies")
    def _():
        y = np.arange(4096, dtype=np.float32)  # host memory: never aliased as device memory
        b = ifrt.from_dlpack(y, client)
        assert b.sharding.devices[0] is client.devices()[0]
        assert b.unsafe_buffer_pointer() != y.ctypes.data
        np.testing.assert_array_equal(np.asarray(b), y)
        try:
            ifrt.from_dlpack(y, client, copy=False)
        except ValueError:
            return "one copy; copy=False refused"
        raise AssertionError("from_dlpack(copy=False) of host memory into a GPU did not refuse")

    @check("pinned-host-view")
    def _():
        kinds = [str(m.kind) for m in device.memories()]
        if "pinned_host" not in kinds:
            return f"skipped: memory kinds {kinds}"
        p = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(device, "pinned_host"))
        view = np.asarray(p)
        assert p.__dlpack_device__() == (KDLCUDAHOST, 0), p.__dlpack_device__()
        assert view.ctypes.data == p.unsafe_buffer_pointer()
        np.testing.assert_array_equal(view, x)
        return "kDLCUDAHost, NumPy view at the buffer's address"

    try:
        import jax
        import jax.numpy as jnp
        from ifrtpy.interop import jax as ij
        jdev = {d.id: d for d in jax.devices("cuda")}[device.id]
    except Exception as e:
        print(f"FAIL jax-import: {type(e).__name__}: {e}", flush=True)
        results.append(False)
        jax = None

    if jax is not None:
        @check("to-jax-zero-copy")
        def _():
            j = jax.dlpack.from_dlpack(a)
            assert j.devices() == {jdev}, j.devices()
            assert j.unsafe_buffer_pointer() == pointer, (hex(j.unsafe_buffer_pointer()), hex(pointer))
            k = ij.to_jax(a)
            assert k.unsafe_buffer_pointer() == pointer
            np.testing.assert_array_equal(np.asarray(k), x)
            return f"jax.dlpack.from_dlpack and ifrtpy.to_jax alias {hex(pointer)} on {jdev}"

        @check("from-jax-zero-copy")
        def _():
            j = jax.device_put(jnp.arange(x.size, dtype=jnp.float32), jdev).block_until_ready()
            b = ifrt.from_dlpack(j, client)
            assert b.sharding.devices[0] is device, b.sharding
            assert b.unsafe_buffer_pointer() == j.unsafe_buffer_pointer()
            c = ij.from_jax(j, client)
            assert c.unsafe_buffer_pointer() == j.unsafe_buffer_pointer()
            np.testing.assert_array_equal(np.asarray(c), x)
            return "ifrtpy.from_dlpack and ifrtpy.from_jax alias jax's buffer"

        @check("round-trip-ifrtpy-jax-ifrtpy")
        def _():
            back = ifrt.from_dlpack(ij.to_jax(a), client)
            assert back.unsafe_buffer_pointer() == pointer
            return "same address after ifrtpy -> jax -> ifrtpy"

        @check("sharded-bridge")
        def _():
            n = len(client.devices())
            if n < 2:
                return "skipped: one GPU"
            mesh = jax.sharding.Mesh(np.array(jax.devices("cuda")[:n]), ("x",))
            js = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
            j = jax.device_put(x[: x.size // n * n], js).block_until_ready()
            i = ij.from_jax(j, client)
            k = ij.to_jax(i)
            ptrs = sorted(s.data.unsafe_buffer_pointer() for s in j.addressable_shards)
            assert sorted(s.unsafe_buffer_pointer() for s in i.disassemble_into_single_device_arrays()) == ptrs
            assert sorted(s.data.unsafe_buffer_pointer() for s in k.addressable_shards) == ptrs
            return f"{n} shards aliased both ways"

    try:
        import torch
    except ImportError:
        torch = None
        print("PASS torch: skipped (not installed)", flush=True)
    if torch is not None:
        @check("torch-zero-copy")
        def _():
            t = torch.from_dlpack(a)
            assert t.device.type == "cuda" and t.device.index == hw, t.device
            assert t.data_ptr() == pointer
            assert torch.equal(t[:5].cpu(), torch.arange(5, dtype=torch.float32))
            u = torch.arange(1024, dtype=torch.float32, device=f"cuda:{hw}")
            b = ifrt.from_dlpack(u, client)
            assert b.sharding.devices[0] is device and b.unsafe_buffer_pointer() == u.data_ptr()
            np.testing.assert_array_equal(np.asarray(b), np.arange(1024, dtype=np.float32))
            return "torch.from_dlpack and ifrtpy.from_dlpack(torch) alias"

    try:
        import cupy
    except ImportError:
        cupy = None
        print("PASS cupy: skipped (not installed)", flush=True)
    if cupy is not None:
        @check("cupy-zero-copy")
        def _():
            with cupy.cuda.Device(hw):
                c = cupy.from_dlpack(a)
                assert c.data.ptr == pointer, (hex(c.data.ptr), hex(pointer))
                assert int(c[7]) == 7
                u = cupy.arange(1024, dtype=cupy.float32)
            b = ifrt.from_dlpack(u, client)
            assert b.unsafe_buffer_pointer() == u.data.ptr
            np.testing.assert_array_equal(np.asarray(b), np.arange(1024, dtype=np.float32))
            return "cupy.from_dlpack and ifrtpy.from_dlpack(cupy) alias"

    @check("figures")
    def _():
        big = np.ones(64 * MiB // 4, np.float32)
        sharding = ifrt.SingleDeviceSharding(device)
        figures = []

        def timed(label, fn, number):
            fn()
            start = time.perf_counter()
            for _ in range(number):
                fn()
            figures.append(f"{label} {(time.perf_counter() - start) / number * 1e6:.1f}us")

        timed("put64MiB", lambda: client.make_array_from_host_buffer(big, sharding).block_until_ready(), 5)
        g = client.make_array_from_host_buffer(big, sharding)
        timed("get64MiB", lambda: np.asarray(g), 5)
        timed("__dlpack__", lambda: g.__dlpack__(stream=1), 200)
        if jax is not None:
            timed("to_jax", lambda: ij.to_jax(g), 200)
            jg = ij.to_jax(g)
            timed("from_jax", lambda: ij.from_jax(jg, client), 200)
        return ", ".join(figures)

    return 0 if all(results) else 1


if __name__ == "__main__":
    start = time.perf_counter()
    code = main()
    print(f"done in {time.perf_counter() - start:.1f}s", flush=True)
    sys.exit(code)
