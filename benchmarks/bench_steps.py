"""Whole steps through ifrtpy next to jax, in one run, on every CPU plugin installed.

The steps (each program lowered once by jax on its built-in CPU client; ifrtpy compiles
that lowered program on each plugin, and the outputs are checked against jax's first):

* ``infer``: put a fresh f32[32, 512] batch, run a 4-layer tanh MLP 512 wide, read the
  logits into NumPy; one step per sample.
* ``train``: an 8-layer MLP SGD step (MSE loss), the 16 parameters donated and fed back;
  8 steps, then wait; a sample is the loop's time per step.
* ``dp``: that step data-parallel over 8 devices (batch f32[256, 512] split, parameters
  replicated, gradients all-reduced); 2 steps, then wait.
* ``attention``: an SGD step of a transformer block (4 heads, width 256, sequence 128,
  batch 4: attention, layer norm, a tanh MLP), parameters donated; 4 steps, then wait.

The configurations: ``jax`` (jax's built-in CPU client with 8 devices), ``ifrtpy <plugin>``
for each installed XLA CPU build (an 8-device client), and with ``--jax-over-plugins``
``jax <plugin>``: jax over the same plugin, the plugin's own speed under jax's layer.
In every round each configuration takes its samples in turn, the order reversed every
other round, so a slow stretch of the machine falls on all of them alike. Per step and
configuration: p50 and p99 over every sample, the spread of the round medians
(min..max), and the p50 and p99 ratios to jax's. ``--json`` writes all of it.

    python benchmarks/bench_steps.py [--rounds 7] [--steps infer,train,dp,attention]
        [--plugins NAME,...] [--jax-over-plugins] [--json FILE]
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

WIDTH, BATCH, DP_BATCH, LR = 512, 32, 256, 1e-3
HEADS, MODEL, SEQ, SEQ_BATCH = 4, 256, 128, 4
DEVICES = 8

#: Step -> (steps per sample, samples per configuration and round).
SAMPLING = {"infer": (1, 40), "train": (8, 3), "dp": (2, 2), "attention": (4, 2)}


# -- the programs (jax) --------------------------------------------------------------------

def programs(jax):
    """The step functions and their data: name -> (function, donated argument numbers,
    host arguments), each argument a NumPy array or a list of them."""
    jnp = jax.numpy
    rng = np.random.default_rng(0)

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    def mlp_params(layers):
        params = []
        for _ in range(layers):
            params += [normal(WIDTH, WIDTH, scale=WIDTH ** -0.5), np.zeros(WIDTH, np.float32)]
        return params

    def mlp(params, x):
        for i in range(0, len(params), 2):
            x = jnp.tanh(x @ params[i] + params[i + 1])
        return x

    def sgd(loss):
        def step(params, x, y):
            grads = jax.grad(loss)(params, x, y)
            return [p - LR * g for p, g in zip(params, grads)]
        return step

    def mlp_loss(params, x, y):
        return jnp.mean((mlp(params, x) - y) ** 2)

    def block(params, x):
        wq, wk, wv, wo, w1, w2 = params
        b, s, d = x.shape
        hd = d // HEADS

        def heads(t):
            return t.reshape(b, s, HEADS, hd).transpose(0, 2, 1, 3)

        q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
        weights = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.float32(hd ** 0.5), axis=-1)
        h = (weights @ v).transpose(0, 2, 1, 3).reshape(b, s, d) @ wo + x
        mean = h.mean(-1, keepdims=True)
        h = (h - mean) / jnp.sqrt(((h - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
        return jnp.tanh(h @ w1) @ w2 + h

    def block_loss(params, x, y):
        return jnp.mean((block(params, x) - y) ** 2)

    block_params = [normal(MODEL, MODEL, scale=MODEL ** -0.5) for _ in range(4)] + [
        normal(MODEL, 4 * MODEL, scale=MODEL ** -0.5), normal(4 * MODEL, MODEL, scale=(4 * MODEL) ** -0.5)]
    return {
        "infer": (mlp, (), [mlp_params(4), normal(BATCH, WIDTH)]),
        "train": (sgd(mlp_loss), (0,), [mlp_params(8), normal(BATCH, WIDTH), normal(BATCH, WIDTH)]),
        "dp": (sgd(mlp_loss), (0,), [mlp_params(8), normal(DP_BATCH, WIDTH), normal(DP_BATCH, WIDTH)]),
        "attention": (sgd(block_loss), (0,), [block_params, normal(SEQ_BATCH, SEQ, MODEL),
                                               normal(SEQ_BATCH, SEQ, MODEL)]),
    }


def batches(count):
    """Fresh inference batches, one per step in turn."""
    rng = np.random.default_rng(1)
    return [rng.standard_normal((BATCH, WIDTH), dtype=np.float32) for _ in range(count)]


def jitted(jax, step, fn, donated, devices):
    """jax.jit of ``fn`` and the sharding of each argument (None: one device)."""
    if step != "dp":
        return jax.jit(fn, donate_argnums=donated), None
    mesh = jax.sharding.Mesh(np.array(devices[:DEVICES]), ("x",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    shardings = (replicated, split, split)
    return jax.jit(fn, in_shardings=shardings, out_shardings=replicated,
                   donate_argnums=donated), shardings


# -- the runners ----------------------------------------------------------------------------

class JaxSteps:
    """The steps through jax.jit on the devices of one jax platform."""

    def __init__(self, jax, platform, fns):
        self.jax = jax
        self.devices = jax.devices(platform)
        self.fns = fns
        self.state = {}

    def setup(self, step):
        jax = self.jax
        fn, donated, host = self.fns[step]
        f, shardings = jitted(jax, step, fn, donated, self.devices)
        targets = shardings or (self.devices[0],) * len(host)
        args = [jax.device_put(a, t) for a, t in zip(host, targets)]
        self.state[step] = (f, args)

    def first_output(self, step):
        f, args = self.state[step]
        if step == "infer":
            return np.asarray(f(*args))
        out = f(*[self.jax.tree_util.tree_map(lambda a: a.copy(), args[0])] + args[1:])
        return np.asarray(out[0])

    def run(self, step, steps, batch_list):
        f, args = self.state[step]
        jax = self.jax
        if step == "infer":
            params, device = args[0], self.devices[0]
            for batch in batch_list[:steps]:
                np.asarray(f(params, jax.device_put(batch, device)))
            return
        params, rest = args[0], args[1:]
        for _ in range(steps):
            params = f(params, *rest)
        jax.block_until_ready(params)
        args[0] = params


class IfrtpySteps:
    """The same steps through an ifrtpy client, each program the one jax lowered."""

    def __init__(self, ifrt, client, fns, lowered):
        self.ifrt = ifrt
        self.client = client
        self.devices = client.devices()
        self.fns = fns
        self.lowered = lowered
        self.state = {}

    def setup(self, step):
        ifrt, client = self.ifrt, self.client
        host = self.fns[step][2]
        if step == "dp":
            devices = self.devices[:DEVICES]
            exe = client.compile(ifrt.HloProgram(self.lowered[step]),
                                 ifrt.CompileOptions(devices=devices, num_partitions=DEVICES))
            mesh = ifrt.Mesh(np.array(devices), ("x",))
            shardings = [ifrt.NamedSharding(mesh, ifrt.PartitionSpec()),
                         ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x")),
                         ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x"))]
        else:
            exe = client.compile(ifrt.HloProgram(self.lowered[step]))
            shardings = [ifrt.SingleDeviceSharding(self.devices[0])] * len(host)
        args = []
        for value, sharding in zip(host, shardings):
            put = [client.make_array_from_host_buffer(a, sharding) for a in
                   (value if isinstance(value, list) else [value])]
            args.append(put if isinstance(value, list) else put[0])
        self.state[step] = (exe, args, shardings[-1])

    def first_output(self, step):
        exe, args, _ = self.state[step]
        if step == "infer":
            return np.asarray(exe(*args[0], args[1])[0])
        host = self.fns[step][2][0]
        sharding = args[0][0].sharding
        fresh = [self.client.make_array_from_host_buffer(a, sharding) for a in host]
        return np.asarray(exe(*fresh, *args[1:])[0])

    def run(self, step, steps, batch_list):
        exe, args, sharding = self.state[step]
        if step == "infer":
            params, put = args[0], self.client.make_array_from_host_buffer
            for batch in batch_list[:steps]:
                np.asarray(exe(*params, put(batch, sharding))[0])
            return
        params, rest = args[0], args[1:]
        for _ in range(steps):
            params = exe(*params, *rest)
        for a in params:
            a.block_until_ready()
        args[0] = params


# -- measuring -----------------------------------------------------------------------------

def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def measure(configs, step, rounds, batch_list):
    """Seconds per step of each configuration: every sample, and each round's median."""
    per_sample, count = SAMPLING[step]
    samples = {name: [] for name in configs}
    medians = {name: [] for name in configs}
    for runner in configs.values():  # warm up
        runner.run(step, per_sample, batch_list)
    names = list(configs)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            runner, taken = configs[name], []
            for i in range(count):
                feed = batch_list[(i * per_sample) % len(batch_list):] + batch_list
                start = time.perf_counter()
                runner.run(step, per_sample, feed)
                taken.append((time.perf_counter() - start) / per_sample)
            samples[name] += taken
            medians[name].append(statistics.median(taken))
    return samples, medians


def fmt(seconds):
    return f"{seconds * 1e3:8.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:8.1f} us"


def installed_plugins(wanted):
    """(name, path) of each XLA CPU build installed (``wanted``: those names only)."""
    from ifrtpy.plugins.builds import installed_builds

    found = [(build.name, path) for build, path in installed_builds()]
    if wanted:
        missing = set(wanted) - {name for name, _ in found}
        if missing:
            sys.exit(f"not installed: {', '.join(sorted(missing))} (found: "
                     f"{', '.join(n for n, _ in found) or 'none'})")
        found = [(n, p) for n, p in found if n in wanted]
    return found


def jax_name(plugin):
    """The platform name a plugin is registered with jax under."""
    return plugin.replace("-", "_")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", default="infer,train,dp,attention")
    parser.add_argument("--plugins", default="", help="comma-separated build names (default: all installed)")
    parser.add_argument("--jax-over-plugins", action="store_true",
                        help="also run jax over each plugin (the plugin's own speed)")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()
    steps = [s for s in args.steps.split(",") if s]
    unknown = set(steps) - set(SAMPLING)
    if unknown:
        sys.exit(f"unknown steps: {', '.join(sorted(unknown))} (known: {', '.join(SAMPLING)})")
    plugins = installed_plugins([p for p in args.plugins.split(",") if p])

    if args.jax_over_plugins:  # jax initializes only the platforms named here
        os.environ["JAX_PLATFORMS"] = ",".join(["cpu"] + [jax_name(n) for n, _ in plugins])
    import jax

    if args.jax_over_plugins:
        from jax._src import xla_bridge  # jax's plugin registry: no public API for a path

        for name, path in plugins:
            xla_bridge.register_plugin(jax_name(name), priority=-100, library_path=path,
                                       options={"cpu_device_count": DEVICES})
    import ifrtpy as ifrt

    fns = programs(jax)
    builtin = JaxSteps(jax, "cpu", fns)
    lowered = {}
    for step in steps:
        fn, donated, host = fns[step]
        f, shardings = jitted(jax, step, fn, donated, builtin.devices)
        lowered[step] = f.lower(*host)
    configs = {"jax": builtin}
    versions = {}
    for name, path in plugins:
        client = ifrt.get_client("pjrt", plugin=path, device_count=DEVICES)
        versions[name] = "%d.%d" % client.plugin.api_version
        configs[f"ifrtpy {name}"] = IfrtpySteps(ifrt, client, fns, lowered)
        if args.jax_over_plugins:
            configs[f"jax {name}"] = JaxSteps(jax, jax_name(name), fns)
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else []
    print(f"jax {jax.__version__}, ifrtpy {ifrt.__version__}, {os.cpu_count()} CPUs, load {' '.join(load)}")
    print("plugins: " + ", ".join(f"{n} (PJRT {versions[n]})" for n, _ in plugins))
    print(f"{args.rounds} rounds; per step: p50 and p99 over every sample, the round medians' "
          "spread, ratios to jax")

    batch_list = batches(64)
    report = {"rounds": args.rounds, "load_before": load, "plugins": versions, "steps": {}}
    for step in steps:
        for runner in configs.values():
            runner.setup(step)
        reference = builtin.first_output(step)
        for name, runner in configs.items():
            np.testing.assert_allclose(runner.first_output(step), reference, rtol=2e-3, atol=2e-4,
                                       err_msg=f"{name} computes another {step} step than jax")
        samples, medians = measure(configs, step, args.rounds, batch_list)
        base50, base99 = percentile(samples["jax"], 50), percentile(samples["jax"], 99)
        per_sample, count = SAMPLING[step]
        print(f"\n{step}: {count} samples per round, {per_sample} step(s) each")
        print(f"  {'configuration':32s} {'p50':>11s} {'p99':>11s}   {'round medians':>23s}  "
              f"{'p50/jax':>7s} {'p99/jax':>7s}")
        rows = {}
        for name in configs:
            p50, p99 = percentile(samples[name], 50), percentile(samples[name], 99)
            low, high = min(medians[name]), max(medians[name])
            print(f"  {name:32s} {fmt(p50)} {fmt(p99)}   {fmt(low)}..{fmt(high).strip():>10s}  "
                  f"{p50 / base50:7.2f} {p99 / base99:7.2f}")
            rows[name] = {"p50_s": p50, "p99_s": p99, "round_medians_s": medians[name],
                          "p50_ratio": p50 / base50, "p99_ratio": p99 / base99}
        report["steps"][step] = rows
        for runner in configs.values():
            runner.state.pop(step, None)
    report["load_after"] = open("/proc/loadavg").read().split()[:3] if load else []
    print(f"\nload after: {' '.join(report['load_after'])}")
    for name, _ in plugins:
        key = f"ifrtpy {name}"
        worst50 = max(report["steps"][s][key]["p50_ratio"] for s in steps)
        worst99 = max(report["steps"][s][key]["p99_ratio"] for s in steps)
        print(f"{key}: worst p50/jax {worst50:.2f}, worst p99/jax {worst99:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
