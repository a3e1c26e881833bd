"""Programs of the jax corpus (tests/program/jax_programs.py), jitted by an unmodified jax
process, run through the IFRT Proxy server on the pjrt backend and equal jax's CPU client in
the same process (within each program's tolerance). A sample: each compile reads the
program's bytes in a child process on the server (seconds each); the whole corpus is the
acceptance runner's job."""

import pathlib

import pytest

pytest.importorskip("grpc")
pytest.importorskip("jax")

import ffi_library  # noqa: E402
import ifrtpy as ifrt  # noqa: E402
from ifrtpy._pjrt import _ffi  # noqa: E402
from ifrtpy import proxy  # noqa: E402

from test_server_jax import run_jax  # noqa: E402

PROGRAMS = ("mlp_train_step", "attention", "scan_rnn", "ffts", "linalg_solve", "sorting",
            "shard_map_psum", "data_parallel_step")

CORPUS = str(pathlib.Path(__file__).resolve().parents[1] / "program")


def test_corpus_programs_through_the_server_equal_jax_direct():
    client = ifrt.get_client("pjrt", device_count=8)
    wanted = PROGRAMS
    if _ffi.framework_version(client._handle.plugin) < ffi_library.header_version():
        # jaxlib's LAPACK kernels are built for a newer XLA FFI than the plugin runs (jax 0.12
        # with the default plugin): the server refuses linalg programs, as get_client does
        wanted = tuple(name for name in PROGRAMS if name != "linalg_solve")
    with proxy.serve(client) as running:
        result = run_jax(running.address, f"""
            sys.path.insert(0, {CORPUS!r})
            import jax_programs
            wanted = {wanted!r}
            errors = {{}}

            make_mesh = jax.make_mesh

            def run(program, devices):
                # the programs make their mesh with jax.make_mesh: over these devices
                jax.make_mesh = lambda shape, names, **kw: Mesh(np.array(devices).reshape(shape), names)
                try:
                    return list_run(program, devices)
                finally:
                    jax.make_mesh = make_mesh

            def list_run(program, devices):
                fn = program.fn
                if program.specs is None:
                    args = [jax.device_put(a, devices[0]) for a in program.args]
                    return jax.tree.leaves(jax.jit(fn)(*args))
                mesh = Mesh(np.array(devices), ("x",))
                args = [jax.device_put(a, NamedSharding(mesh, s))
                        for a, s in zip(program.args, program.specs)]
                return jax.tree.leaves(jax.jit(fn)(*args))

            for program in jax_programs.corpus():
                if program.name not in wanted:
                    continue
                through = [np.asarray(x) for x in run(program, PROXY)]
                jax.clear_caches()  # both clients' devices are "cpu" 0-7 to jax's caches
                direct = [np.asarray(x) for x in run(program, CPU)]
                jax.clear_caches()
                worst = max(float(np.max(np.abs(a - b), initial=0.0)) /
                            max(1.0, float(np.max(np.abs(b), initial=0.0)))
                            for a, b in zip(through, direct))
                if len(through) != len(direct) or worst > program.tolerance:
                    errors[program.name] = worst
            emit(errors=errors, ran=sorted(p.name for p in jax_programs.corpus()
                                           if p.name in wanted))
        """)
    assert result["errors"] == {}
    assert result["ran"] == sorted(wanted)
