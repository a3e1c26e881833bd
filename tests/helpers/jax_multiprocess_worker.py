"""One process of a 2-process x 4-CPU-device run of the jax backend on loopback (run by
tests/backends/jax/test_jax_multiprocess.py): ``python jax_multiprocess_worker.py PROCESS_ID PORT MODE``;
or one process of a job started by ``python -m ifrtpy launch`` (tests/cli/test_launch.py):
``python jax_multiprocess_worker.py launched``, which joins with initialize() alone,
exchanges key-value entries and runs a psum over every process's devices (prints OK).

MODE ``spmd``: a global array assembled from per-process shards, an SPMD program with
psum and all_gather across the processes, resharding across the process boundary, and
host copies: of a split array refused, of replicated ones read whole; prints OK at the end.
MODE ``lone``: the other process never comes: initialize raises (printed as ``ERROR``).
MODEs ``dies-after``, ``dies-during``, ``coordinator-dies``, ``coordinator-leaves``: both
processes run a psum together (``FIRST OK``), then process 1 (process 0, which started
the job's coordinator, for the ``coordinator`` ones) dies at once, or 1 s into the
survivor's next psum, or leaves the job (``shutdown()``, printing the coordinator's pid)
and exits; the survivor runs the psum again and prints the ifrtpy error it gets
(``ERROR <class> <seconds> ...``), then leaves.
MODE ``default-backend``: initialize() with the default backend, then get_client("jax")
joins the job (8 devices), a key-value exchange and a psum; ``jax-first``: jax started
before initialize(), so get_client("jax") raises (printed as ``ERROR``).
MODE ``half-state`` (one process): initialize(backend="jax") failing at its last step, and
after jax has started, leaves jax's settings and state, XLA_FLAGS and the port as they were.
Every mode that survives prints ``EXITING`` last and exits 0.
"""

import os
import sys
import time

import numpy as np

import ifrtpy as ifrt
from ifrtpy.backends.jax import initialize_distributed
from ifrtpy.sharding import SingleDeviceShardSemantics

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
INITIALIZATION_TIMEOUT_LONE_S = 3
HEARTBEAT_S, SHUTDOWN_S, COLLECTIVE_S = 3, 5, 3


def check_shards(array, expected):
    """Every addressable shard of ``array`` equals the NumPy slice of its index domain."""
    domains = array.sharding.index_domains(array.shape, ADDRESSABLE)
    shards = array.disassemble_into_single_device_arrays()
    assert len(shards) == 4, len(shards)
    for domain, shard in zip(domains, shards):
        np.testing.assert_array_equal(shard.copy_to_host_buffer().result(60),
                                      expected[domain.slices()])


def spmd(client):
    import jax
    from jax.sharding import PartitionSpec as P

    devices = client.devices()
    assert client.device_count() == 8 and client.addressable_device_count() == 4
    assert [d.is_addressable for d in devices] == [d.process_index == client.process_index()
                                                   for d in devices]
    split = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)), ifrt.PartitionSpec("x"))
    full = np.arange(16, dtype=np.float32)
    shape = ifrt.Shape([16])
    domains = split.index_domains(shape, ADDRESSABLE)
    spec = ifrt.HostBufferShards([([j], full[d.slices()]) for j, d in enumerate(domains)],
                                 ifrt.ArraySpec(np.float32, shape, split))
    (x,) = client.make_arrays_from_host_buffer_shards([spec])
    check_shards(x, full)

    try:
        x.copy_to_host_buffer()
        raise AssertionError("copy_to_host_buffer of a non-fully-addressable array passed")
    except ifrt.errors.UnimplementedError as e:
        assert "not fully addressable" in str(e), e

    mesh = jax.sharding.Mesh(np.array([d.jax_device for d in devices]), ("x",))

    def body(block):
        return jax.lax.psum(block, "x"), jax.lax.all_gather(block, "x", tiled=True)

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P(), P()),
                                    check_vma=False))
    lowered = program.lower(jax.ShapeDtypeStruct(
        (16,), np.float32, sharding=jax.sharding.NamedSharding(mesh, P("x"))))
    executable = client.compile(lowered, ifrt.CompileOptions(
        devices=client.make_device_list(devices), num_partitions=8))
    total, gathered = executable.execute([x]).outputs
    check_shards(total, full.reshape(8, 2).sum(axis=0))
    check_shards(gathered, full)
    # Replicated over both processes: read whole here, as jax reads its value.
    for replicated_out, expected in ((total, full.reshape(8, 2).sum(axis=0)), (gathered, full)):
        np.testing.assert_array_equal(np.asarray(replicated_out.jax_value), expected)
        np.testing.assert_array_equal(replicated_out.copy_to_host_buffer().result(60), expected)

    reversed_split = ifrt.NamedSharding(ifrt.Mesh(np.array(devices[::-1]), ("x",)),
                                        ifrt.PartitionSpec("x"))
    replicated = ifrt.NamedSharding(split.mesh, ifrt.PartitionSpec())
    moved, whole = client.reshard_arrays(
        [x, x], [ifrt.ArraySpec(np.float32, shape, reversed_split),
                 ifrt.ArraySpec(np.float32, shape, replicated)])
    check_shards(moved, full)  # shard i now lives in the other process
    check_shards(whole, full)
    np.testing.assert_array_equal(np.asarray(whole), full)
    print("OK", flush=True)


def psum_program(client):
    """A psum over all the devices of the job (every process) of an array of 2 elements
    per device split over them, compiled; its argument; and the psum's value by NumPy."""
    import jax
    from jax.sharding import PartitionSpec as P

    devices = client.devices()
    size = 2 * len(devices)
    split = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)), ifrt.PartitionSpec("x"))
    full = np.arange(size, dtype=np.float32)
    domains = split.index_domains(ifrt.Shape([size]), ADDRESSABLE)
    (x,) = client.make_arrays_from_host_buffer_shards([ifrt.HostBufferShards(
        [([j], full[d.slices()]) for j, d in enumerate(domains)],
        ifrt.ArraySpec(np.float32, ifrt.Shape([size]), split))])
    mesh = jax.sharding.Mesh(np.array([d.jax_device for d in devices]), ("x",))
    program = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "x"), mesh=mesh,
                                    in_specs=P("x"), out_specs=P(), check_vma=False))
    lowered = program.lower(jax.ShapeDtypeStruct(
        (size,), np.float32, sharding=jax.sharding.NamedSharding(mesh, P("x"))))
    executable = client.compile(lowered, ifrt.CompileOptions(
        devices=client.make_device_list(devices), num_partitions=len(devices)))
    return executable, x, full.reshape(-1, 2).sum(axis=0)


def exchange_and_psum(client, local_devices):
    """The job's processes exchange values through its key-value store, and a psum over
    all their devices (``local_devices`` in each) equals NumPy's."""
    pid, count = ifrt.distributed.process_id(), ifrt.distributed.num_processes()
    store = ifrt.distributed.key_value_store()
    store.put(f"test:from{pid}", f"hello {pid}".encode())
    for other in range(count):
        assert store.get(f"test:from{other}", 60_000) == f"hello {other}".encode()
    assert client.device_count() == count * local_devices, client.device_count()
    assert client.addressable_device_count() == local_devices
    assert client.process_index() == pid
    executable, x, expected = psum_program(client)
    np.testing.assert_array_equal(run_psum(executable, x), expected)
    print(f"OK {pid} of {count}: psum over {client.device_count()} devices", flush=True)


def launched():
    """A process started by ``python -m ifrtpy launch --devices-per-process K``: it joins
    the job with initialize() alone, and get_client("jax") spans the job."""
    ifrt.distributed.initialize(initialization_timeout=60, heartbeat_timeout=HEARTBEAT_S)
    assert ifrt.distributed.job_backend() == "pjrt"
    exchange_and_psum(ifrt.get_client("jax"), int(os.environ["IFRTPY_LOCAL_DEVICE_COUNT"]))


def default_backend(address, process_id, jax_first):
    """initialize(address, 2, process_id) with the default backend, then get_client("jax"):
    jax's runtime joins the job as it starts (device_count is this process's count), or,
    when jax started first, get_client("jax") refuses to be a single-process client."""
    if jax_first:
        import jax

        jax.devices()  # jax's runtime starts, alone
    ifrt.distributed.initialize(address, 2, process_id, initialization_timeout=60,
                                heartbeat_timeout=HEARTBEAT_S)
    if jax_first:
        report_failure("get_client", lambda: ifrt.get_client("jax", platform="cpu"))
        return
    client = ifrt.get_client("jax", platform="cpu", device_count=4)
    assert ifrt.get_client("jax", device_count=4).device_count() == 8  # its own 4 devices
    exchange_and_psum(client, 4)


def run_psum(executable, x):
    """The psum's first addressable shard, read back (where a failed collective raises)."""
    (total,) = executable.execute([x]).outputs
    return total.disassemble_into_single_device_arrays()[0].copy_to_host_buffer().result(120)


def report_failure(what, fn):
    """Run ``fn``; print ``ERROR <ifrtpy error class> <seconds> <message>`` when it raises an
    ifrtpy error (the worker then goes on and exits normally)."""
    start = time.monotonic()
    try:
        fn()
    except ifrt.errors.IfrtError as e:
        message = str(e).replace("\n", " ")[:300]
        print(f"ERROR {type(e).__name__} {time.monotonic() - start:.2f} {what}: {message}",
              flush=True)
        return True
    print(f"NO ERROR {what} {time.monotonic() - start:.2f}", flush=True)
    return False


def jax_state():
    """What initialize(backend="jax") changes: jax's settings and distributed state,
    XLA_FLAGS."""
    import jax
    from ifrtpy import _jaxlib

    names = ("jax_cpu_collectives_implementation", "jax_num_cpu_devices",
             "jax_cpu_get_local_topology_timeout_minutes",
             "jax_cpu_get_global_topology_timeout_minutes")
    state = _jaxlib.jax_distributed_state()
    return ({name: getattr(jax.config, name) for name in names},
            (state.service, state.client, state.process_id, state.num_processes),
            os.environ.get("XLA_FLAGS"))


def port_is_free(port):
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def half_state(address, port):
    """initialize(backend="jax") failing after its service and client started (the hand-over
    to jax raises), then after jax has started: nothing changed, nothing left running."""
    from ifrtpy.distributed import jax_runtime as jax_distributed

    before = jax_state()

    def broken(flags, seconds):
        raise RuntimeError("injected failure")

    jax_distributed.with_collective_timeout = broken
    try:
        ifrt.distributed.initialize(address, 1, 0, backend="jax", local_device_count=2,
                                    initialization_timeout=5, heartbeat_timeout=3)
        raise AssertionError("initialize passed")
    except RuntimeError as e:
        assert "injected failure" in str(e), e
    assert jax_state() == before, (jax_state(), before)
    assert not ifrt.distributed.is_initialized() and port_is_free(port)

    import jax

    jax.devices()  # jax's runtime starts
    report_failure("initialize after jax started", lambda: ifrt.distributed.initialize(
        address, 1, 0, backend="jax", initialization_timeout=5))
    assert jax_state() == before and not ifrt.distributed.is_initialized() and port_is_free(port)


def timed_shutdown():
    start = time.monotonic()
    ifrt.distributed.shutdown()
    print(f"SHUTDOWN {time.monotonic() - start:.2f}", flush=True)


def main():
    if sys.argv[1:] == ["launched"]:
        launched()
        return  # leaves the job at exit
    process_id, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    address = f"127.0.0.1:{port}"
    if mode in ("default-backend", "jax-first"):
        default_backend(address, process_id, jax_first=mode == "jax-first")
        print("EXITING", flush=True)
        return
    if mode == "lone":  # the other process never comes
        report_failure("initialize", lambda: ifrt.distributed.initialize(
            address, 2, process_id, backend="jax", local_device_count=4,
            initialization_timeout=INITIALIZATION_TIMEOUT_LONE_S, heartbeat_timeout=3))
        assert not ifrt.distributed.is_initialized()
        assert jax_state()[1][1] is None and os.environ.get("XLA_FLAGS") is None
        if process_id == 0:
            assert port_is_free(int(port))
        print("EXITING", flush=True)
        return
    if mode == "half-state":
        half_state(address, int(port))
        print("EXITING", flush=True)
        return
    if mode == "initialize-fails-in-0":  # after the join: process 1 must not notice
        if process_id == 0:
            from ifrtpy.distributed import jax_runtime as jax_distributed

            def broken(flags, seconds):
                raise RuntimeError("injected failure")

            jax_distributed.with_collective_timeout = broken
        start = time.monotonic()
        try:
            ifrt.distributed.initialize(address, 2, process_id, backend="jax",
                                        local_device_count=4, initialization_timeout=20,
                                        heartbeat_timeout=3)
        except RuntimeError as e:
            print(f"FAILED {time.monotonic() - start:.2f} {e}", flush=True)
            print("EXITING", flush=True)
            return
        time.sleep(2)  # process 0 has failed and gone by then
        store = ifrt.distributed.key_value_store()
        store.put("test:alive", b"yes")
        assert store.get("test:alive", 5000) == b"yes"
        timed_shutdown()
        print("EXITING", flush=True)
        return
    if mode == "spmd":  # the public entry point, shared with the PJRT path
        ifrt.distributed.initialize(address, 2, process_id, backend="jax",
                                    local_device_count=4, initialization_timeout=60,
                                    heartbeat_timeout=3)
        assert ifrt.distributed.process_id() == process_id and ifrt.distributed.num_processes() == 2
        store = ifrt.distributed.key_value_store()  # the client jax's runtime uses too
        store.put(f"test:from{process_id}", f"hello {process_id}".encode())
        other = 1 - process_id
        assert store.get(f"test:from{other}", 60_000) == f"hello {other}".encode()
        spmd(ifrt.get_client("jax"))
        return  # leaves the job at exit
    # A process dies once both have run one program together: the backend's own entry point.
    initialize_distributed(address, 2, process_id, local_device_count=4,
                           initialization_timeout=60, heartbeat_timeout=HEARTBEAT_S,
                           shutdown_timeout=SHUTDOWN_S, collective_timeout=COLLECTIVE_S)
    executable, x, expected = psum_program(ifrt.get_client("jax"))
    np.testing.assert_array_equal(expected, [56.0, 64.0])
    np.testing.assert_array_equal(run_psum(executable, x), expected)
    print("FIRST OK", flush=True)
    store = ifrt.distributed.key_value_store()  # both have read the first result: a victim
    store.put(f"test:first{process_id}", b"ok")  # leaving sooner can reset the other's read
    store.get(f"test:first{1 - process_id}", 60_000)
    victim = 0 if mode.startswith("coordinator") else 1
    if process_id == victim:
        if mode == "coordinator-leaves":
            print(f"COORDINATOR {ifrt.distributed.job._state.coordinator.pid}", flush=True)
            timed_shutdown()  # at once: the service stays with the job's coordinator
            print("EXITING", flush=True)
            return
        if mode == "dies-during":
            time.sleep(1)  # the other process is inside the psum by then
        os._exit(0)  # gone without a word
    if mode != "dies-during":
        time.sleep(0.5)  # the other process is gone by then
    report_failure("execute", lambda: run_psum(executable, x))
    report_failure("execute again", lambda: run_psum(executable, x))
    timed_shutdown()
    print("EXITING", flush=True)


if __name__ == "__main__":
    main()
