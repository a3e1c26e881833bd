"""Client creation by plugin name next to creation by path, and the bare plugin call.

Three ways to a 4-device CPU client, one of each in turn (so load on the machine falls
on all three alike): the Cython layer's ``_pjrt.create_client`` on the loaded plugin
(the floor: the plugin's PJRT_Client_Create plus ifrtpy's device handles),
``get_client("pjrt", plugin=PATH)`` and ``get_client("cpu")`` (discovery included).
Each figure is the median of ``--repeats`` x ``--number`` single creations; the clients
are freed every ``--number`` rounds, untimed. The run fails (exit status 1) when by-name
costs more than 10% over by-path.

    cd benchmarks && PYTHONPATH=.. python bench_plugins.py [--repeats 15] [--number 20]
"""

import argparse
import gc
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import ifrtpy as ifrt
from ifrtpy import _pjrt
from ifrtpy.plugins.builds import default_cpu_library


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--number", type=int, default=20)
    args = parser.parse_args()

    path = default_cpu_library()
    plugin = _pjrt.load_plugin(path)
    ways = {
        "floor (_pjrt.create_client)": lambda: _pjrt.create_client(plugin, {}),
        "by path (get_client('pjrt', plugin=PATH))": lambda: ifrt.get_client("pjrt", plugin=path),
        "by name (get_client('cpu'))": lambda: ifrt.get_client("cpu"),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for fn in ways.values():
        fn()  # warm up: loads the plugin, fills the discovery cache
    gc.disable()  # clients and their device handles form cycles: freed below, untimed
    try:
        for i in range(args.repeats * args.number):
            for name, fn in ways.items():  # one of each in turn: load falls on all alike
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
            if i % args.number == args.number - 1:
                gc.collect()
    finally:
        gc.enable()
    medians = {name: statistics.median(t) for name, t in times.items()}
    floor = medians["floor (_pjrt.create_client)"]
    for name, t in medians.items():
        print(f"{name:45s} {t * 1e6:9.1f} us   {t / floor:5.2f} x floor")
    by_path = medians["by path (get_client('pjrt', plugin=PATH))"]
    ratio = medians["by name (get_client('cpu'))"] / by_path
    verdict = "within" if ratio <= 1.10 else "OVER"
    print(f"by name / by path = {ratio:.3f} ({verdict} the 10% budget)")
    return 0 if ratio <= 1.10 else 1


if __name__ == "__main__":
    sys.exit(main())
