"""The corpus of jax programs (jax_programs.py), each lowered by jax and run by ifrtpy in
every form it can take (the Lowered stage, the jax.export Exported object and its
serialized bytes; host callback programs as Lowered stages only, which alone carry their
callables) on the PjRt and jax backends, against jax's own result.

Linear algebra calls jaxlib's LAPACK kernels: on the PjRt backend it runs on the default
plugin where that plugin's XLA runs jaxlib's kernels, else on an installed plugin whose XLA
does; with none installed, the default plugin's refusal is checked (it names the kernel
and both XLA FFI versions). ``IFRTPY_CORPUS_PLUGIN`` (a name of tests/helpers/cpu_plugins.py)
runs the PjRt side on another installed plugin.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

import ifrtpy as ifrt
from cpu_plugins import PLUGINS, plugin_path
from ifrtpy.errors import FailedPreconditionError

jax = pytest.importorskip("jax")
import ffi_library  # noqa: E402
import jax_programs  # noqa: E402

PROGRAMS = {p.name: p for p in jax_programs.corpus()}
FORMS = ("lowered", "exported", "bytes")


def _cases():
    for name, program in PROGRAMS.items():
        for form in (("lowered",) if "callback" in program.kinds else FORMS):
            yield name, form


@pytest.fixture(scope="module", autouse=True)
def read_serialized_forms_at_once():
    """The Exported and bytes forms of every program read in one child process (each
    would take one of its own)."""
    from ifrtpy.program import inputs

    inputs.stablehlo_texts([_stage(name, form) for name, form in _cases() if form != "lowered"])


@pytest.fixture(scope="module")
def clients():
    name = os.environ.get("IFRTPY_CORPUS_PLUGIN")
    path = None if name is None else plugin_path(name)
    if name is not None and path is None:
        pytest.skip(f"IFRTPY_CORPUS_PLUGIN={name}: not installed")
    return {"pjrt": ifrt.get_client("pjrt", plugin=path, device_count=8),
            "jax": ifrt.get_client("jax")}


def _runs_jaxlib_kernels(client) -> bool:
    from ifrtpy._pjrt import _ffi

    return _ffi.framework_version(client._handle.plugin) >= ffi_library.header_version()


@pytest.fixture(scope="module")
def linalg_pjrt(clients):
    """A PjRt client whose plugin runs jaxlib's kernels (the default one first), or None."""
    if _runs_jaxlib_kernels(clients["pjrt"]):
        return clients["pjrt"]
    for name in PLUGINS:
        path = plugin_path(name)
        if path is not None:
            client = ifrt.get_client("pjrt", plugin=path, device_count=8)
            if _runs_jaxlib_kernels(client):
                return client
    return None


@functools.lru_cache(maxsize=None)
def _stage(name: str, form: str):
    program = PROGRAMS[name]
    jitted = program.jitted()
    if form == "lowered":
        return jitted.lower(*program.args)
    exported = jax.export.export(jitted)(*program.shapes())
    return exported if form == "exported" else exported.serialize()


@functools.lru_cache(maxsize=None)
def _expected(name: str) -> list[np.ndarray]:
    program = PROGRAMS[name]
    args = program.args
    if program.specs is not None:
        mesh = program.mesh()
        args = [jax.device_put(a, jax.sharding.NamedSharding(mesh, s)) for a, s in zip(args, program.specs)]
    return [np.asarray(leaf) for leaf in jax.tree.leaves(program.jitted()(*args))]


def _run(client, name: str, form: str) -> list[np.ndarray]:
    program = PROGRAMS[name]
    count = 8 if "spmd" in program.kinds else 1
    devices = ifrt.DeviceList(client.devices()[:count])
    exe = client.compile(ifrt.HloProgram(_stage(name, form)),
                         ifrt.CompileOptions(devices=devices, num_partitions=count))
    arrays = [ifrt.device_put(np.asarray(a), s) for a, s in zip(program.args, exe.parameter_shardings())]
    return [np.asarray(o) for o in exe(*arrays)]


def _check(got, want, tolerance):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=tolerance, atol=tolerance)


def test_the_corpus_is_large_enough():
    assert len(PROGRAMS) >= 30
    kinds = [k for p in PROGRAMS.values() for k in p.kinds]
    assert kinds.count("linalg") >= 5 and kinds.count("callback") >= 3 and kinds.count("spmd") >= 4


@pytest.mark.parametrize("name, form", list(_cases()))
@pytest.mark.parametrize("backend", ["pjrt", "jax"])
def test_program_runs_as_jax_runs_it(clients, linalg_pjrt, backend, name, form):
    program = PROGRAMS[name]
    client = clients[backend]
    kernels = "linalg" in program.kinds or ("math" in program.kinds and form == "lowered")
    if backend == "pjrt" and kernels and client is not linalg_pjrt:
        if linalg_pjrt is None:
            with pytest.raises(FailedPreconditionError, match=r"jaxlib's kernel '(lapack|cpu)_.*XLA FFI"):
                _run(client, name, form)
            return
        client = linalg_pjrt
    _check(_run(client, name, form), _expected(name), program.tolerance)
