"""A StableHLO program that runs as long as its second argument says, on any backend: for
tests of what goes on meanwhile (proxy sessions, the reference backend's workers)."""

import time

import numpy as np

import ifrtpy as ifrt

#: n steps (the second argument, i32) of a 32x32 matmul and tanh of the first.
SLOW = """module @slow { func.func public @main(%a: tensor<32x32xf32>, %n: tensor<i32>)
    -> tensor<32x32xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %one = stablehlo.constant dense<1> : tensor<i32>
  %r:3 = stablehlo.while(%i = %c0, %m = %n, %x = %a) : tensor<i32>, tensor<i32>, tensor<32x32xf32>
    cond { %p = stablehlo.compare LT, %i, %m : (tensor<i32>, tensor<i32>) -> tensor<i1>
           stablehlo.return %p : tensor<i1> }
    do { %j = stablehlo.add %i, %one : tensor<i32>
         %y = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0]
             : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
         %z = stablehlo.tanh %y : tensor<32x32xf32>
         stablehlo.return %j, %m, %z : tensor<i32>, tensor<i32>, tensor<32x32xf32> }
  return %r#2 : tensor<32x32xf32> } }"""


def slow_call(client, seconds):
    """``(run, steps)``: ``run(steps)`` runs SLOW on ``client``'s first device, and
    returns when its output is ready; ``steps`` makes it run about ``seconds`` on this
    machine now."""
    exe = client.compile(ifrt.HloProgram(SLOW), ifrt.CompileOptions(
        devices=client.make_device_list(client.devices()[:1])))
    sharding = ifrt.SingleDeviceSharding(client.devices()[0])
    a = client.make_array_from_host_buffer(np.eye(32, dtype=np.float32), sharding)

    def run(steps):
        n = client.make_array_from_host_buffer(np.int32(steps), sharding)
        np.asarray(exe.execute([a, n], ifrt.ExecuteOptions()).outputs[0])

    def took(steps):
        start = time.perf_counter()
        run(steps)
        return time.perf_counter() - start

    took(1)  # the first execute may start things (the reference backend's workers)
    steps = 1
    while (seconds_now := took(steps)) < 0.2:
        steps *= 4
    return run, max(1, int(steps * seconds / seconds_now))
