"""``python -m ifrtpy demo``: what ``info`` prints, then a sharded array on the devices
(drawn: which device holds which rows) and a StableHLO program over it (SPMD), every result
checked against NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np

import ifrtpy as ifrt
from ifrtpy.cli.info import info

# y = x * 2 + 1 on f32[R, 4], rows split over all devices (GSPMD sharding annotations).
DEMO_PROGRAM = """
func.func public @main(%x: tensor<{rows}x4xf32> {{mhlo.sharding = "{{devices=[{n},1]<=[{n}]}}"}})
    -> (tensor<{rows}x4xf32> {{mhlo.sharding = "{{devices=[{n},1]<=[{n}]}}"}}) {{
  %two = stablehlo.constant dense<2.0> : tensor<{rows}x4xf32>
  %one = stablehlo.constant dense<1.0> : tensor<{rows}x4xf32>
  %0 = stablehlo.multiply %x, %two : tensor<{rows}x4xf32>
  %1 = stablehlo.add %0, %one : tensor<{rows}x4xf32>
  return %1 : tensor<{rows}x4xf32>
}}
"""


def demo(client: Any) -> None:
    info(client)
    devices = client.addressable_devices()
    n = len(devices)
    x = np.arange(n * 2 * 4, dtype=np.float32).reshape(n * 2, 4)
    sharding: ifrt.Sharding = ifrt.NamedSharding(ifrt.Mesh(np.array(devices), ("x",)),
                                                 ifrt.PartitionSpec("x"))
    a = client.make_array_from_host_buffer(x, sharding)
    print(f"\narray    {a.dtype}{list(a.shape)} split over {n} devices by {sharding}")
    ifrt.visualize_sharding(a)
    shards = a.disassemble_into_single_device_arrays()    # in the sharding's device order
    for shard, domain in zip(shards, sharding.index_domains(a.shape), strict=True):
        np.testing.assert_array_equal(np.asarray(shard), x[domain.index])
    np.testing.assert_array_equal(np.asarray(a), x)

    program = ifrt.HloProgram(DEMO_PROGRAM.format(rows=n * 2, n=n))
    exe = client.compile(program, ifrt.CompileOptions(devices=devices, num_partitions=n))
    (y,) = exe(a)
    np.testing.assert_array_equal(np.asarray(y), x * 2 + 1)
    print(f"\nprogram  y = x * 2 + 1, compiled for {n} devices (SPMD)")
    print(f"  output sharding {y.sharding}")
    print(f"  y[:, 0] = {np.asarray(y)[:, 0].tolist()}  (equals NumPy)")
