"""The child side of the robustness suite (``test_robustness.py``): each mode runs in its
own process, so that a crash or a hang fails the test instead of killing pytest.

    python robustness_worker.py fuzz                  # JSON calls on stdin, one result per line
    python robustness_worker.py lifetimes SEED ORDERS  # random release orders, then exit busy
    python robustness_worker.py threads SEED SECONDS   # 8 threads on one shared pool of arrays
    python robustness_worker.py race SECONDS           # SPMD execute racing a delete

A mode prints one JSON line of counts and exits 0 when ifrtpy behaved: every call either
returned NumPy's answer or raised an ifrtpy error (or, for a typed parameter of the Cython
layer, Cython's TypeError naming it); any other outcome is counted under "wrong" (a wrong
value) or "unclear" (a foreign exception) with a sample.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time

import numpy as np

import ifrtpy as ifrt
from ifrtpy import errors

ADD1 = """
func.func public @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<8xf32>
  %y = stablehlo.add %x, %one : tensor<8xf32>
  return %y : tensor<8xf32>
}"""

SPMD = """
func.func public @main(%x: tensor<8x8xf32> {mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"})
    -> (tensor<8x8xf32> {mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"}) {
  %two = stablehlo.constant dense<2.0> : tensor<8x8xf32>
  %y = stablehlo.multiply %x, %two : tensor<8x8xf32>
  return %y : tensor<8x8xf32>
}"""

DONATE = """
func.func public @main(%x: tensor<8xf32> {jax.buffer_donor = true}) -> tensor<8xf32> {
  %three = stablehlo.constant dense<3.0> : tensor<8xf32>
  %y = stablehlo.multiply %x, %three : tensor<8xf32>
  return %y : tensor<8xf32>
}"""

HEAVY = """
func.func public @main(%x: tensor<128x128xf32>) -> tensor<128x128xf32> {
  %a = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0] : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %b = stablehlo.dot_general %a, %x, contracting_dims = [1] x [0] : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  return %b : tensor<128x128xf32>
}"""

TIMEOUT = 20.0  # seconds a result may take before it counts as never ready


class Outcome:
    """Counts of what calls did, with one sample message per kind."""

    def __init__(self) -> None:
        self.counts = {"ok": 0, "refused": 0, "wrong": 0, "unclear": 0, "never_ready": 0}
        self.samples: dict[str, str] = {}
        self.lock = threading.Lock()

    def add(self, kind: str, sample: str = "") -> None:
        with self.lock:
            self.counts[kind] += 1
            if sample and kind not in ("ok", "refused"):
                self.samples.setdefault(kind, sample[:300])

    def run(self, what: str, call, expected=None) -> object:
        """``call()``; its value is compared with ``expected`` (a NumPy array) if given."""
        try:
            value = call()
        except errors.DeadlineExceededError as e:
            self.add("never_ready", f"{what}: {e}")
            return None
        except errors.IfrtError:
            self.add("refused")
            return None
        except TypeError as e:
            if not str(e).startswith("Argument '"):  # Cython's check of a typed parameter
                self.add("unclear", f"{what}: TypeError: {e}")
                return None
            self.add("refused")  # "Argument 'memory' has incorrect type (expected ..., got int)"
            return None
        except Exception as e:  # noqa: BLE001
            self.add("unclear", f"{what}: {type(e).__name__}: {e}")
            return None
        if expected is not None and not (
                isinstance(value, np.ndarray) and value.shape == expected.shape
                and np.array_equal(value, expected)):
            self.add("wrong", f"{what}: got {value!r}, expected {expected!r}")
            return None
        self.add("ok")
        return value

    def report(self, **extra) -> None:
        print(json.dumps({**self.counts, "samples": self.samples, **extra}), flush=True)


def read(array) -> np.ndarray:
    return array.copy_to_host_buffer().result(timeout=TIMEOUT)


# -- fuzz -------------------------------------------------------------------------------

class Fuzz:
    """Builds hostile values from JSON tokens and runs public calls on them."""

    def __init__(self) -> None:
        self.client = ifrt.get_client("pjrt", device_count=8)
        self.devices = self.client.devices()
        self.add1 = self.client.compile(ifrt.HloProgram(ADD1))
        self.spmd = self.client.compile(ifrt.HloProgram(SPMD), ifrt.CompileOptions(
            devices=self.devices, num_partitions=8))
        self.x8 = np.arange(8, dtype=np.float32)
        self.x88 = np.arange(64, dtype=np.float32).reshape(8, 8)

    # values
    def value(self, token):
        kind, *rest = token
        if kind == "int":
            return rest[0]
        if kind == "float":
            return float(rest[0])
        if kind == "none":
            return None
        if kind in ("str", "bool", "ints"):
            return rest[0]
        if kind == "list":
            return [self.value(t) for t in rest[0]]
        if kind == "tuple":
            return tuple(self.value(t) for t in rest[0])
        if kind == "np":
            dtype, shape, layout = rest
            size = int(np.prod(shape)) if shape else 1
            data = (np.arange(size) % 7).astype(dtype).reshape(shape)
            if layout == "f":
                data = np.asfortranarray(data)
            elif layout == "neg" and data.ndim:
                data = data[::-1]
            elif layout == "strided" and data.ndim:
                data = np.repeat(data, 2, axis=0)[::2]
            return data
        if kind == "dev":
            return self.devices[rest[0] % len(self.devices)]
        if kind == "devs":
            return [self.devices[i % len(self.devices)] for i in rest[0]]
        if kind == "array":
            return self.array(rest[0])
        if kind == "sharding":
            return self.sharding(*rest)
        if kind == "memkind":
            return rest[0]
        raise ValueError(f"unknown token {token!r}")

    def array(self, which: str):
        if which == "x8":
            return self.client.make_array_from_host_buffer(
                self.x8, ifrt.SingleDeviceSharding(self.devices[0]))
        if which == "x88":
            return self.client.make_array_from_host_buffer(self.x88, self.spmd.parameter_shardings()[0])
        if which == "dynamic":
            spec = ifrt.ArraySpec(ifrt.DType.from_numpy(np.float32),
                                  ifrt.DynamicShape((4,), [True]), ifrt.SingleDeviceSharding(self.devices[0]))
            return self.client.make_error_arrays(errors.InvalidArgumentError("no data"), [spec])[0]
        if which == "deleted":
            a = self.client.make_array_from_host_buffer(self.x8, ifrt.SingleDeviceSharding(self.devices[1]))
            a.delete()
            return a
        return np.arange(4)  # a NumPy array where an Array is expected

    def sharding(self, kind: str, *args):
        v = self.value
        if kind == "single":
            return ifrt.SingleDeviceSharding(v(args[0]))
        if kind == "concrete":
            devs, shape, shard_shapes, domains = args
            return ifrt.ConcreteSharding(
                v(devs), v(shape), [v(s) for s in shard_shapes],
                None if domains is None else [ifrt.IndexDomain(v(o), v(s)) for o, s in domains])
        if kind == "even":
            devs, shape, shard, replicated = args
            return ifrt.ConcreteEvenSharding(v(devs), v(shape), v(shard), replicated)
        if kind == "param":
            dims, perm, sizes, devs = args
            return ifrt.ShardingParamSharding(ifrt.ShardingParam(v(dims), v(perm), v(sizes)), v(devs))
        if kind == "named":
            devs, mesh_shape, names, spec = args
            devices = np.empty(len(v(devs)), object)
            devices[:] = v(devs)
            try:  # the harness's own reshape: a shape NumPy refuses is no ifrtpy call
                devices = devices.reshape(v(mesh_shape))
            except (TypeError, ValueError):
                raise errors.InvalidArgumentError("harness: NumPy refused the mesh shape") from None
            mesh = ifrt.Mesh(devices, v(names))
            return ifrt.NamedSharding(mesh, ifrt.PartitionSpec(*v(spec)))
        raise ValueError(kind)

    # calls: each builds its arguments inside the call, so a refusal there counts too
    def call(self, out: Outcome, name: str, args: list) -> None:
        v = self.value
        c = self.client
        if name == "shape":
            out.run(name, lambda: ifrt.Shape(v(args[0])))
        elif name == "device_list":
            out.run(name, lambda: ifrt.DeviceList(v(args[0])))
        elif name == "sharding":
            out.run(name, lambda: v(args[0]))
        elif name == "put":
            data = v(args[0])
            expected = np.asarray(data) if isinstance(data, np.ndarray) else None
            out.run(name, lambda: read(c.make_array_from_host_buffer(data, v(args[1]), v(args[2]))),
                    expected)
        elif name == "get_strided":
            a = self.array("x8")
            out.run(name, lambda: a.copy_to_host_buffer(byte_strides=v(args[0])).result(timeout=TIMEOUT),
                    self.x8)
        elif name == "get_into":
            a = self.array("x8")
            out.run(name, lambda: a.copy_to_host_buffer(v(args[0])).result(timeout=TIMEOUT), self.x8)
        elif name == "execute":
            out.run(name, lambda: read(self.add1.execute(v(args[0]), v(args[1]), v(args[2])).outputs[0]),
                    self.x8 + 1)
        elif name == "execute_spmd":
            out.run(name, lambda: read(self.spmd.execute(v(args[0])).outputs[0]), self.x88 * 2)
        elif name == "copy_arrays":
            arrays = v(args[0])

            def copy():
                copies = c.copy_arrays(arrays, v(args[1]), v(args[2]))
                if len(copies) != len(arrays):
                    raise AssertionError(f"{len(arrays)} arrays gave {len(copies)} copies")
                for copy, array in zip(copies, arrays):  # each copy holds its source's value
                    if not np.array_equal(read(copy), read(array)):
                        return read(copy)
                return self.x8
            out.run(name, copy, self.x8)
        elif name == "reshard":
            a = self.array("x8")
            out.run(name, lambda: read(c.reshard_arrays(
                [a], [ifrt.ArraySpec(a.dtype, v(args[0]), v(args[1]))])[0]), self.x8)
        elif name == "compile":
            out.run(name, lambda: c.compile(ifrt.HloProgram(ADD1), ifrt.CompileOptions(
                devices=v(args[0]), num_replicas=v(args[1]), num_partitions=v(args[2]))))
        elif name == "compile_debug":
            out.run(name, lambda: c.compile(ifrt.HloProgram(ADD1), ifrt.CompileOptions(
                debug_options={v(args[0]): v(args[1])})))
        elif name == "execute_options":
            out.run(name, lambda: ifrt.ExecuteOptions(launch_id=v(args[0]), fill_status=v(args[1])))
        elif name == "lookup_device":
            out.run(name, lambda: c.lookup_device(v(args[0])))
        elif name == "assemble":
            a = self.array("x8")
            out.run(name, lambda: read(c.assemble_array_from_single_device_arrays(
                v(args[0]), v(args[1]), [a])), self.x8)
        elif name == "array_spec":
            out.run(name, lambda: ifrt.ArraySpec(v(args[0]), v(args[1]), v(args[2])))
        elif name == "pjrt_put":
            data = v(args[0])
            expected = np.asarray(data) if isinstance(data, np.ndarray) else None

            def put():
                index = v(args[1])
                device = self.devices[index]._handle if 0 <= index < len(self.devices) else None
                buffer, _ = ifrt._pjrt.buffer_from_host_buffer(c._handle, data, device, None, v(args[2]))
                return buffer.to_numpy()
            out.run(name, put, expected)
        elif name == "pjrt_execute":
            a = self.array("x8")
            out.run(name, lambda: self.add1._handle.execute(
                [[a._buffers[0]]] if args[0] == "ok" else v(args[0]), v(args[1]), v(args[2]))[0][0][0].to_numpy(),
                self.x8 + 1)
        elif name == "disassemble":
            a = v(args[0])

            def pieces():
                whole = read(a)  # before: disassembling may donate a
                shards = a.disassemble_into_single_device_arrays(v(args[1]))
                for shard, domain in zip(shards, a.sharding.index_domains(a.shape)):
                    if not np.array_equal(read(shard), whole[domain.slices()]):
                        return read(shard)
                return self.x8
            out.run(name, pieces, self.x8)
        elif name == "replicated_shard":
            a = v(args[0])
            out.run(name, lambda: read(a.fully_replicated_shard(v(args[1]))), self.x8)
        elif name == "error_arrays":
            out.run(name, lambda: c.make_error_arrays(v(args[0]), [ifrt.ArraySpec(
                np.float32, (8,), ifrt.SingleDeviceSharding(self.devices[0]))])[0].ready_future().result(
                    timeout=TIMEOUT))
        elif name == "deleted_use":
            a = self.array("deleted")
            use = {"get": lambda: read(a), "copy": lambda: c.copy_arrays([a]),
                   "execute": lambda: self.add1(a), "reshard": lambda: c.reshard_arrays(
                       [a], [ifrt.ArraySpec(a.dtype, a.shape, a.sharding)]),
                   "disassemble": lambda: a.disassemble_into_single_device_arrays(),
                   "delete": lambda: (a.delete(), a.delete())[1].result(timeout=TIMEOUT)}[args[0]]
            out.run(name, use)
        elif name == "pjrt_get_into":
            a = self.array("x8")
            out.run(name, lambda: _await_into(a._buffers[0].to_host_buffer(v(args[0]))), self.x8)
        elif name == "pjrt_copy":
            a = self.array("x8")
            target = v(args[0])
            if isinstance(target, ifrt.Device):
                target = target.default_memory()._handle
            out.run(name, lambda: a._buffers[0].copy_to_memory(target).to_numpy(), self.x8)
        elif name == "pjrt_client":  # options are checked by the backend, not the C layer
            out.run(name, lambda: ifrt.backends.pjrt.create_client(
                c._handle.plugin.path, options={args[0]: v(args[1])}))
        elif name == "pjrt_lookup":
            out.run(name, lambda: c._handle.lookup_device(v(args[0])))
        elif name == "repr":
            out.run(name, lambda: repr(v(args[0])))
        else:
            raise ValueError(f"unknown call {name!r}")


def _await_into(result) -> np.ndarray:
    out, event = result
    event.await_()
    return out


def fuzz_mode() -> None:
    fuzz = Fuzz()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        calls = json.loads(line)
        out = Outcome()
        for name, args in calls:
            fuzz.call(out, name, args)
        out.report()


# -- lifetimes --------------------------------------------------------------------------

def lifetimes_mode(seed: int, orders: int) -> None:
    """``orders`` rounds of: make clients, arrays, shards, executables and pending work,
    release them in a random order (delete, drop, donate), reading back every value
    still live after each step. The process then exits with work in flight."""
    rng = random.Random(seed)
    out = Outcome()
    busy = []
    for _ in range(orders):
        objects = _make_world(rng)
        keys = list(objects)
        rng.shuffle(keys)
        for key in keys:
            obj, expected = objects.pop(key)
            action = rng.choice(["delete", "drop", "use"])
            if action == "delete" and hasattr(obj, "delete"):
                out.run(f"delete {key}", obj.delete)
            elif action == "use":
                _use(out, key, obj, expected)
            del obj
            for other, (live, want) in objects.items():  # the rest is unharmed
                if want is not None and not live.is_deleted():
                    out.run(f"read {other} after releasing {key}", lambda: read(live), want)
        busy.append(_start_work(rng))
    out.report(orders=orders)
    # Exit with work in flight (the interpreter's teardown must wait for it or drop it).


def _make_world(rng: random.Random) -> dict:
    client = ifrt.get_client("pjrt", device_count=rng.choice([1, 2, 8]))
    devices = client.devices()
    x = np.arange(8, dtype=np.float32)
    add1 = client.compile(ifrt.HloProgram(ADD1))
    a = client.make_array_from_host_buffer(x, ifrt.SingleDeviceSharding(devices[0]))
    world = {"client": (client, None), "add1": (add1, None), "a": (a, x)}
    if len(devices) == 8:
        spmd = client.compile(ifrt.HloProgram(SPMD), ifrt.CompileOptions(devices=devices, num_partitions=8))
        x88 = np.arange(64, dtype=np.float32).reshape(8, 8)
        s = client.make_array_from_host_buffer(x88, spmd.parameter_shardings()[0])
        out, = spmd(s)
        world.update({"spmd": (spmd, None), "s": (s, x88), "s2": (out, x88 * 2)})
        shards = s.disassemble_into_single_device_arrays()
        domains = s.sharding.index_domains(s.shape)
        i = rng.randrange(len(shards))
        world["shard"] = (shards[i], x88[domains[i].slices()])
    b, = add1(a)
    world["b"] = (b, x + 1)
    return world


def _use(out: Outcome, key: str, obj, expected) -> None:
    if expected is not None:
        out.run(f"read {key}", lambda: read(obj), expected)


def _start_work(rng: random.Random):
    client = ifrt.get_client("pjrt", device_count=rng.choice([1, 4]))
    heavy = client.compile(ifrt.HloProgram(HEAVY))
    h = client.make_array_from_host_buffer(np.ones((128, 128), np.float32) / 128,
                                           heavy.parameter_shardings()[0])
    outs = [heavy(h)[0] for _ in range(rng.randrange(1, 6))]
    return rng.choice([outs, outs[-1:], []]), rng.choice([client, None])


# -- threads ----------------------------------------------------------------------------

def threads_mode(seed: int, seconds: float, num_threads: int = 8) -> None:
    """``num_threads`` threads share one client and a pool of arrays: they put, read,
    execute (single device, SPMD, donating), copy, reshard and delete at random. A value
    read from a live array must be its expected value; a result must become ready."""
    rng0 = random.Random(seed)
    c = ifrt.get_client("pjrt", device_count=8)
    devs = c.devices()
    add1 = c.compile(ifrt.HloProgram(ADD1))
    donate = c.compile(ifrt.HloProgram(DONATE))
    spmd = c.compile(ifrt.HloProgram(SPMD), ifrt.CompileOptions(devices=devs, num_partitions=8))
    spmd_sharding = spmd.parameter_shardings()[0]
    single = ifrt.SingleDeviceSharding(devs[0])
    x8 = np.arange(8, dtype=np.float32)
    x88 = np.arange(64, dtype=np.float32).reshape(8, 8)
    pool: list = [None] * 16  # (array, expected), shared without locks on purpose
    out = Outcome()
    stop = time.monotonic() + seconds

    def step(rng: random.Random) -> None:
        slot = rng.randrange(len(pool))
        entry = pool[slot]
        op = rng.choice(["put", "put88", "read", "exe", "spmd", "donate", "delete", "copy",
                         "reshard", "copy_donate"])
        if op == "put":
            pool[slot] = (out.run(op, lambda: c.make_array_from_host_buffer(x8, single)), x8)
        elif op == "put88":
            pool[slot] = (out.run(op, lambda: c.make_array_from_host_buffer(x88, spmd_sharding)), x88)
        elif entry is None or entry[0] is None:
            return
        else:
            array, want = entry
            if op == "read":
                out.run(op, lambda: read(array), want)
            elif op == "delete":
                out.run(op, array.delete)
            elif op in ("exe", "donate") and want.shape == (8,):
                exe = add1 if op == "exe" else donate
                result = out.run(op, lambda: exe(array)[0])
                if result is not None:
                    out.run(f"read {op}", lambda: read(result), want + 1 if op == "exe" else want * 3)
            elif op == "spmd" and want.shape == (8, 8):
                result = out.run(op, lambda: spmd(array)[0])
                if result is not None:
                    out.run("read spmd", lambda: read(result), want * 2)
            elif op in ("copy", "copy_donate"):
                semantics = (ifrt.ArrayCopySemantics.DONATE_INPUT if op == "copy_donate"
                             else ifrt.ArrayCopySemantics.ALWAYS_COPY)
                targets = devs[1:2] if len(array.sharding.devices) == 1 else devs[::-1]
                copy = out.run(op, lambda: c.copy_arrays([array], targets, None, semantics)[0])
                if copy is not None:
                    pool[rng.randrange(len(pool))] = (copy, want)
                    out.run(f"read {op}", lambda: read(copy), want)
            elif op == "reshard":
                target = spmd_sharding if want.shape == (8, 8) else ifrt.SingleDeviceSharding(devs[3])
                if want.shape == (8, 8) and array.sharding == spmd_sharding:
                    target = ifrt.NamedSharding(ifrt.Mesh(np.array(devs).reshape(2, 4), ("a", "b")),
                                                ifrt.PartitionSpec("b", "a"))
                spec = ifrt.ArraySpec(array.dtype, array.shape, target)
                moved = out.run(op, lambda: c.reshard_arrays([array], [spec])[0])
                if moved is not None:
                    out.run("read reshard", lambda: read(moved), want)

    def worker(k: int) -> None:
        rng = random.Random(rng0.random() + k)
        while time.monotonic() < stop:
            step(rng)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(num_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.report(threads=num_threads, seconds=seconds)


def race_mode(seconds: float) -> None:
    """Two threads execute an SPMD program on the array a third keeps deleting."""
    c = ifrt.get_client("pjrt", device_count=8)
    exe = c.compile(ifrt.HloProgram(SPMD), ifrt.CompileOptions(devices=c.devices(), num_partitions=8))
    sharding = exe.parameter_shardings()[0]
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    current = [c.make_array_from_host_buffer(x, sharding)]
    out = Outcome()
    stop = time.monotonic() + seconds

    def runner() -> None:
        while time.monotonic() < stop:
            result = out.run("execute", lambda: exe(current[0])[0])
            if result is not None:
                out.run("read", lambda: read(result), x * 2)

    def deleter() -> None:
        while time.monotonic() < stop:
            a = c.make_array_from_host_buffer(x, sharding)
            current[0] = a
            time.sleep(random.random() * 2e-4)
            a.delete()

    threads = [threading.Thread(target=runner) for _ in range(2)] + [threading.Thread(target=deleter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.report()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "fuzz":
        fuzz_mode()
    elif mode == "lifetimes":
        lifetimes_mode(int(sys.argv[2]), int(sys.argv[3]))
    elif mode == "threads":
        threads_mode(int(sys.argv[2]), float(sys.argv[3]))
    elif mode == "race":
        race_mode(float(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
