"""Which of ifrtpy's files the first ``exe(a)`` enters, and the repeated one.

``x + 1`` on f32[8], one device of the PjRt backend (the call of bench_execute.py): the
first call checks the execute contract, the repeated one is the C path. A file counts as
entered when a function of it runs during the call: a Python frame (``sys.setprofile``
records each frame's ``co_filename``) or, for the Cython modules, a Cython function, which
shows up to the same hook in a copy of the package built with Cython's ``profile``
directive (built here into a temporary folder; a minute or two). The inline functions of
a ``.pxd`` count as that file, or as the module of its name where there is one (a
``cdef class``'s attributes declared there). Files outside ifrtpy (the standard library,
jaxlib) are listed apart.

    python benchmarks/count_execute_files.py [--keep DIR] [--program add|spmd] [--plain [--json]]

``--program spmd``: ``x * 2 + 1`` on f32[128] split over 8 devices by a NamedSharding.

``--plain``: no profiling copy: the installed package, whose Cython functions the hook
does not see, so only its Python files count (what tests/backends/pjrt/
test_pjrt_execute_files.py pins, with ``--json``: the files of each call as JSON).

``--keep DIR`` builds the profiling copy in DIR, or reuses one built there before.
Needs Python 3.11 (Cython profiles through ``sys.setprofile`` there).
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile


def build_profiling_copy(target: str) -> None:
    """Copy ifrtpy's sources into ``target`` and build every Cython module there with
    Cython's ``profile`` directive."""
    import numpy
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(here, "ifrtpy", "_pjrt"))
    from _header import pjrt_include_dir

    shutil.copytree(os.path.join(here, "ifrtpy"), os.path.join(target, "ifrtpy"),
                    ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__"))
    sources = sorted(glob.glob(os.path.join(target, "ifrtpy", "**", "*.pyx"), recursive=True))
    extensions = [
        Extension(os.path.relpath(path, target)[:-4].replace(os.sep, "."), [path],
                  include_dirs=[pjrt_include_dir(), numpy.get_include()],
                  define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                  extra_compile_args=["-O1"], libraries=["dl"])
        for path in sources]
    directives = {"language_level": 3, "binding": True, "embedsignature": True, "profile": True}
    cwd = os.getcwd()
    os.chdir(target)
    try:
        dist = Distribution({
            "ext_modules": cythonize(extensions, compiler_directives=directives, quiet=True,
                                     nthreads=os.cpu_count() or 1),
            "script_args": ["build_ext", "--inplace", "-q"],
        })
        dist.parse_command_line()
        dist.run_commands()
    finally:
        os.chdir(cwd)


def count(program: str, as_json: bool = False) -> None:
    """In a process importing the profiling copy (or, ``--plain``, the package as
    installed): the files each call enters."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    import jax
    import numpy as np

    import ifrtpy as ifrt

    package = os.path.dirname(ifrt.__file__)
    client = ifrt.get_client("pjrt", device_count=8)
    if program == "add":
        x = np.arange(8, dtype=np.float32)
        exe = client.compile(jax.jit(lambda v: v + 1).lower(x))
        a = ifrt.device_put(x, client.devices()[0])
    else:
        mesh = ifrt.Mesh(np.array(client.devices()), ("x",))
        sharding = ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x"))
        x = np.arange(128, dtype=np.float32)
        jmesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))
        jsharding = jax.sharding.NamedSharding(jmesh, jax.sharding.PartitionSpec("x"))
        exe = client.compile(jax.jit(lambda v: v * 2 + 1, in_shardings=jsharding,
                                     out_shardings=jsharding).lower(x),
                             ifrt.CompileOptions(devices=client.make_device_list(client.devices()),
                                                 num_partitions=8))
        a = ifrt.device_put(x, sharding)
    entered: dict[str, int] = {}

    def hook(frame, event, arg):
        if event == "call":
            name = frame.f_code.co_filename
            entered[name] = entered.get(name, 0) + 1

    root = os.path.dirname(package)

    def source(name: str) -> str:
        """A frame's file, relative to the package root: Cython names its own relative
        (to the build folder), and a ``.pxd`` counts as its module's ``.pyx``."""
        path = name if os.path.isabs(name) else os.path.join(root, name)
        if path.endswith(".pxd") and os.path.exists(path[:-4] + ".pyx"):
            path = path[:-4] + ".pyx"
        return os.path.relpath(path, root) if path.startswith(package) else name

    found = []
    for label in ("first", "repeated"):
        entered.clear()
        sys.setprofile(hook)
        outputs = exe(a)
        sys.setprofile(None)
        outputs[0].block_until_ready()
        files: dict[str, int] = {}
        for name, calls in entered.items():
            files[source(name)] = files.get(source(name), 0) + calls
        ours = sorted(n for n in files if n.startswith("ifrtpy" + os.sep))
        others = sorted(n for n in files if n not in ours)
        found.append(ours)
        if as_json:
            continue
        print(f"{label} exe(a): {len(ours)} ifrtpy files ({sum(files[n] for n in ours)} "
              f"function calls in them); {len(others)} other files")
        for name in ours:
            print(f"  {files[name]:4d}  {name}")
        for name in others:
            print(f"  {files[name]:4d}  ({name})")
    if as_json:
        print(json.dumps(found))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", default=None, help="build (or reuse) the profiling copy here")
    parser.add_argument("--program", choices=("add", "spmd"), default="add")
    parser.add_argument("--plain", action="store_true",
                        help="count in the package as installed: its Python files only")
    parser.add_argument("--json", action="store_true", help="with --plain: print JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child or args.plain:
        count(args.program, args.json)
        return
    target = args.keep or tempfile.mkdtemp(prefix="ifrtpy-profile-")
    if not os.path.isdir(os.path.join(target, "ifrtpy")):
        print(f"building a profiling copy of ifrtpy in {target} ...", flush=True)
        build_profiling_copy(target)
    env = dict(os.environ, PYTHONPATH=target)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--program",
                    args.program], env=env, cwd=target, check=True, timeout=600)
    if args.keep is None:
        shutil.rmtree(target, ignore_errors=True)


if __name__ == "__main__":
    main()
