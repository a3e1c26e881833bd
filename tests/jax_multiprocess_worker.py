"""One process of a 2-process x 4-CPU-device run of the jax backend on loopback (run by
tests/test_jax_multiprocess.py): ``python jax_multiprocess_worker.py PROCESS_ID PORT MODE
[lone]`` (``lone``: its peer will not come, so wait for it 3 s instead of 60 s).

MODE ``spmd``: a global array assembled from per-process shards, an SPMD program with
psum and all_gather across the processes, resharding across the process boundary, and
copy_to_host_buffer of a non-fully-addressable array refused; prints OK at the end.
MODE ``die``: process 1 exits right after joining; process 0 then waits for jax to end it.
"""

import os
import sys
import time

import numpy as np

import ifrtpy as ifrt
from ifrtpy.backends.jax import initialize_distributed
from ifrtpy.sharding import SingleDeviceShardSemantics

ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS


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

    reversed_split = ifrt.NamedSharding(ifrt.Mesh(np.array(devices[::-1]), ("x",)),
                                        ifrt.PartitionSpec("x"))
    replicated = ifrt.NamedSharding(split.mesh, ifrt.PartitionSpec())
    moved, whole = client.reshard_arrays(
        [x, x], [ifrt.ArraySpec(np.float32, shape, reversed_split),
                 ifrt.ArraySpec(np.float32, shape, replicated)])
    check_shards(moved, full)  # shard i now lives in the other process
    check_shards(whole, full)
    print("OK", flush=True)


def main():
    process_id, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    # a lone process (MODE spmd with one process started) waits 3 s for its peer
    lone = len(sys.argv) > 4 and sys.argv[4] == "lone"
    if mode == "spmd":  # the public entry point, shared with the PJRT path
        ifrt.distributed.initialize(f"127.0.0.1:{port}", 2, process_id, backend="jax",
                                    local_device_count=4,
                                    initialization_timeout=3 if lone else 60, heartbeat_timeout=3)
        assert ifrt.distributed.process_id() == process_id and ifrt.distributed.num_processes() == 2
        try:  # the job's store is jax's own
            ifrt.distributed.key_value_store()
            raise AssertionError("key_value_store() in a job on jax's runtime")
        except ifrt.errors.FailedPreconditionError:
            pass
    else:
        initialize_distributed(f"127.0.0.1:{port}", 2, process_id, local_device_count=4,
                               initialization_timeout_s=3 if lone else 60, heartbeat_timeout_s=3)
    client = ifrt.get_client("jax")
    if mode == "spmd":
        spmd(client)
    elif mode == "die":
        if process_id == 1:
            os._exit(0)
        time.sleep(60)
        print("NOT ENDED", flush=True)


if __name__ == "__main__":
    main()
