"""Index domains for a 4096-device, rank-3 mesh and a rank-4 array: ifrtpy vs jax.

Run: ``PYTHONPATH=. python benchmarks/bench_sharding.py`` (jax optional; it gets 4096 CPU
devices through XLA_FLAGS, set here before jax is imported).

Both sides build the device -> box mapping from scratch on every call:
  * cold: ifrtpy builds the NamedSharding and its lowering too; jax clears its caches of
    the lowered HloSharding and of ``devices_indices_map``;
  * warm: the lowering is reused (ifrtpy caches it per rank, jax caches the HloSharding);
    only the index domains are computed.
jax also caches whole ``devices_indices_map`` results per (sharding, shape); that figure is
printed for reference.
"""

from __future__ import annotations

import os
import statistics
import sys
import timeit

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4096").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

from ifrtpy.device import Device, Memory, MemoryKind  # noqa: E402
from ifrtpy.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

MESH_SHAPE = (16, 16, 16)
AXES = ("a", "b", "c")
CASES = [  # (spec, array shape)
    (("a", ("b", "c"), None, None), (64, 512, 8, 4)),        # 4096 distinct tiles
    ((None, "c", None, "a"), (64, 512, 32, 16)),             # 256 tiles, each on 16 devices
]


class _Memory(Memory):
    def __init__(self, device):
        self._device = device

    id = property(lambda self: self._device.id)
    kind = property(lambda self: MemoryKind("device"))

    def devices(self):
        return (self._device,)

    def to_string(self):
        return f"BenchMemory({self._device.id})"


class _Device(Device):
    """A minimal addressable device; the benchmark needs nothing else."""

    def __init__(self, device_id):
        self._id = device_id
        self._memory = _Memory(self)

    client = property(lambda self: None)
    id = property(lambda self: self._id)
    kind = property(lambda self: "bench")
    is_addressable = property(lambda self: True)
    process_index = property(lambda self: 0)

    def memories(self):
        return (self._memory,)

    def default_memory(self):
        return self._memory

    def to_string(self):
        return f"BenchDevice({self._id})"


def median_us(*fns, number=10, repeat=21) -> list[float]:
    """Median microseconds per call of each function; their repeats are interleaved so
    that background load affects all of them alike."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, t in zip(fns, times):
            t.append(timeit.timeit(fn, number=number) / number * 1e6)
    return [statistics.median(t) for t in times]


def main() -> int:
    n = int(np.prod(MESH_SHAPE))
    devices = np.empty(n, dtype=object)
    devices[:] = [_Device(i) for i in range(n)]
    mesh = Mesh(devices.reshape(MESH_SHAPE), AXES)

    try:
        import jax
        from jax._src import named_sharding as jax_named, sharding as jax_sharding
        jax_mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(MESH_SHAPE), AXES)
        if len(jax.devices()) != n:
            raise RuntimeError(f"jax has {len(jax.devices())} devices, not {n}")
    except Exception as e:  # jax missing or too few devices: ifrtpy figures only
        print(f"jax unavailable ({e}); printing ifrtpy figures only")
        jax = None

    print(f"mesh {dict(zip(AXES, MESH_SHAPE))} ({n} devices); median us per call")
    print(f"{'spec':<44} {'array shape':<18} {'mode':<5} {'ifrtpy':>9} {'jax':>9} "
          f"{'jax/ifrtpy':>10}")
    for spec, shape in CASES:
        pspec = PartitionSpec(*spec)
        warm = NamedSharding(mesh, pspec)

        def ours_cold():
            return NamedSharding(mesh, pspec).index_domains(shape)

        def ours_warm():
            return warm.index_domains(shape)

        if jax is None:
            ours = dict(zip(("cold", "warm"), median_us(ours_cold, ours_warm)))
            theirs = {}
        else:
            js = jax.sharding.NamedSharding(jax_mesh, jax.sharding.PartitionSpec(*spec))

            def jax_cold():
                jax_named.named_sharding_to_xla_hlo_sharding.cache_clear()
                jax_sharding.common_devices_indices_map.cache_clear()
                return js.devices_indices_map(shape)

            def jax_warm():
                jax_sharding.common_devices_indices_map.cache_clear()
                return js.devices_indices_map(shape)

            check_same(warm, js, shape)
            oc, jc, ow, jw = median_us(ours_cold, jax_cold, ours_warm, jax_warm)
            ours, theirs = {"cold": oc, "warm": ow}, {"cold": jc, "warm": jw}
            theirs["cache"], = median_us(lambda: js.devices_indices_map(shape), number=1000)
        for mode in ("cold", "warm"):
            jax_us = theirs.get(mode)
            ratio = f"{jax_us / ours[mode]:.2f}x" if jax_us else "-"
            print(f"{str(pspec):<44} {str(shape):<18} {mode:<5} {ours[mode]:>9.1f} "
                  f"{jax_us if jax_us else float('nan'):>9.1f} {ratio:>10}")
        if "cache" in theirs:
            print(f"{'':<44} {'':<18} {'cache':<5} {'-':>9} {theirs['cache']:>9.2f}")
    return 0


def check_same(ours: NamedSharding, theirs, shape) -> None:
    """The two libraries must agree before their timings mean anything."""
    jax_map = theirs.devices_indices_map(shape)
    jax_devices = list(theirs.mesh.devices.flat)
    def normalize(index):
        return tuple(slice(*s.indices(d)) for s, d in zip(index, shape))

    for i, domain in enumerate(ours.index_domains(shape)):
        expected = normalize(jax_map[jax_devices[i]])
        if normalize(domain.slices()) != expected:
            raise AssertionError(f"device {i}: ifrtpy {domain} vs jax {expected}")


if __name__ == "__main__":
    sys.exit(main())
