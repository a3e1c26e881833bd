"""Hypothesis strategies for ifrtpy values: dtypes, shapes, host arrays, meshes, specs,
shardings, and small elementwise StableHLO programs with their NumPy meaning; and the
ci/dev/debug hypothesis profiles (registered on import).

Everything here draws only what every backend must accept: host arrays hold valid values
of their dtype, and shardings divide their shape evenly. Compare host arrays byte-wise
(``a.tobytes() == b.tobytes()``): float dtypes may hold NaNs with payloads, which ``==``
never equates.
"""

from __future__ import annotations

import math
from typing import Sequence

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from ifrtpy.device import Device
from ifrtpy.sharding import Mesh, NamedSharding, PartitionSpec
from ifrtpy.sharding import ConcreteEvenSharding, ConcreteSharding, SingleDeviceSharding

__all__ = [
    "DTYPES",
    "SUB_BYTE_DTYPES",
    "dtypes",
    "shapes",
    "host_arrays",
    "meshes",
    "partition_specs",
    "shardings",
    "register_profiles",
    "PROGRAM_DTYPES",
    "ElementwiseProgram",
    "hlo_sharding_texts",
    "elementwise_programs",
    "program_arguments",
]

#: Sub-byte dtypes (one byte per element on the host), with the range of valid values.
_SUB_BYTE_INT_RANGES = {
    np.dtype(ml_dtypes.int2): (-2, 1),
    np.dtype(ml_dtypes.uint2): (0, 3),
    np.dtype(ml_dtypes.int4): (-8, 7),
    np.dtype(ml_dtypes.uint4): (0, 15),
}
_FLOAT4 = np.dtype(ml_dtypes.float4_e2m1fn)
SUB_BYTE_DTYPES: tuple[np.dtype, ...] = (*_SUB_BYTE_INT_RANGES, _FLOAT4)

_FLOAT8_NAMES = ("float8_e3m4", "float8_e4m3", "float8_e4m3fn", "float8_e4m3b11fnuz",
                 "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")

#: Every dtype an ifrtpy array can hold on the host.
DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(d) for d in (
    np.bool_, np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128,
    ml_dtypes.bfloat16, *(getattr(ml_dtypes, n) for n in _FLOAT8_NAMES if hasattr(ml_dtypes, n)),
)) + SUB_BYTE_DTYPES

_AXIS_NAMES = ("x", "y", "z")


def dtypes(sub_byte: bool = True) -> st.SearchStrategy[np.dtype]:
    """Any NumPy dtype of :data:`DTYPES`; ``sub_byte=False`` leaves out the 2- and 4-bit ones."""
    return st.sampled_from([d for d in DTYPES if sub_byte or d not in SUB_BYTE_DTYPES])


def shapes(max_rank: int = 4, max_side: int = 6, min_rank: int = 0) -> st.SearchStrategy[tuple]:
    """Shapes of rank ``min_rank..max_rank`` with sides ``0..max_side`` (scalars and
    zero-size shapes included)."""
    return st.lists(st.integers(0, max_side), min_size=min_rank, max_size=max_rank).map(tuple)


@st.composite
def host_arrays(draw, dtype, shape) -> np.ndarray:
    """A C-contiguous ndarray of ``dtype`` and ``shape`` holding valid values: bool 0/1,
    sub-byte integers in range, float4 from its 16 codes, anything else from random bytes."""
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    n = math.prod(shape)
    if dtype == np.bool_:
        bits = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        return np.array(bits, dtype).reshape(shape)
    if dtype in _SUB_BYTE_INT_RANGES:
        lo, hi = _SUB_BYTE_INT_RANGES[dtype]
        values = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
        return np.array(values, np.int8).astype(dtype).reshape(shape)
    if dtype == _FLOAT4:
        codes = draw(st.lists(st.integers(0, 15), min_size=n, max_size=n))
        return np.array(codes, np.uint8).view(dtype).reshape(shape)
    raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
    return np.frombuffer(raw, dtype).reshape(shape).copy()


def _factorisations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered way to write ``n`` as a product of ``parts`` positive integers."""
    if parts == 1:
        return [(n,)]
    return [(d, *rest) for d in range(1, n + 1) if n % d == 0
            for rest in _factorisations(n // d, parts - 1)]


@st.composite
def meshes(draw, devices: Sequence[Device], max_axes: int = 3) -> Mesh:
    """A mesh over all of ``devices`` in a random order, with 1..``max_axes`` axes
    ("x", "y", "z") whose sizes multiply to ``len(devices)``."""
    devices = list(devices)
    rank = draw(st.integers(1, max_axes))
    sizes = draw(st.sampled_from(_factorisations(len(devices), rank)))
    order = draw(st.permutations(devices))
    grid = np.empty(len(order), dtype=object)
    grid[:] = order
    return Mesh(grid.reshape(sizes), _AXIS_NAMES[:rank])


@st.composite
def partition_specs(draw, mesh: Mesh, rank: int, shape: Sequence[int] | None = None
                    ) -> PartitionSpec:
    """A spec of ``rank`` entries using each mesh axis at most once (an entry is None, one
    axis or a tuple of axes). With ``shape``, dimension ``d`` is only split into a number
    of pieces that divides ``shape[d]``."""
    remaining = list(draw(st.permutations(mesh.axis_names)))
    sizes = mesh.shape
    entries = []
    for d in range(rank):
        axes, pieces = [], 1
        for axis in list(remaining):
            fits = shape is None or shape[d] % (pieces * sizes[axis]) == 0
            if fits and draw(st.booleans()):
                axes.append(axis)
                pieces *= sizes[axis]
                remaining.remove(axis)
        entries.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*entries)


def _named_to_concrete(named: NamedSharding, shape) -> ConcreteSharding:
    domains = named.index_domains(shape)
    return ConcreteSharding(named.devices, shape, [d.shape for d in domains], domains,
                            memory_kind=named.memory_kind)


#: The sharding kinds :func:`shardings` draws, by name.
SHARDING_KINDS = ("single", "named", "sharding_param", "concrete_even", "concrete")


@st.composite
def shardings(draw, devices: Sequence[Device], shape: Sequence[int],
              memory_kinds: Sequence | None = None, kinds: Sequence[str] = SHARDING_KINDS):
    """A sharding of an array of ``shape`` over some of ``devices`` (a random subset in a
    random order), of any of ``kinds`` (:data:`SHARDING_KINDS`, default all):
    SingleDeviceSharding, NamedSharding, the ShardingParamSharding it lowers to, a fully
    replicated ConcreteEvenSharding, or a ConcreteSharding with index domains. Shards
    always divide ``shape`` evenly. With ``memory_kinds``, the memory kind is drawn from
    them (else the default)."""
    shape = tuple(shape)
    unknown = sorted(set(kinds) - set(SHARDING_KINDS))
    if unknown or not kinds:
        raise ValueError(f"sharding kinds are some of {SHARDING_KINDS}, got {list(kinds)}")
    kind = None if not memory_kinds else draw(st.sampled_from(list(memory_kinds)))
    which = draw(st.sampled_from([k for k in SHARDING_KINDS if k in kinds]))
    if which == "single":
        return SingleDeviceSharding(draw(st.sampled_from(list(devices))), kind)
    count = draw(st.integers(1, len(devices)))
    chosen = draw(st.permutations(list(devices)))[:count]
    if which == "concrete_even":
        return ConcreteEvenSharding(chosen, shape, shape, True, kind)
    mesh = draw(meshes(chosen))
    named = NamedSharding(mesh, draw(partition_specs(mesh, len(shape), shape)), kind)
    if which == "sharding_param":
        return named.lower(len(shape))
    if which == "concrete":
        return _named_to_concrete(named, shape)
    return named


# -- hypothesis profiles ----------------------------------------------------------------------

def register_profiles() -> None:
    """Register ifrtpy's hypothesis profiles (done on import of this module):

    * ``ci``: 40 examples, derandomized (reproducible), no deadline;
    * ``dev``: 300 random examples;
    * ``debug``: 20 examples, verbose.

    Choose one with ``settings.load_profile(name)`` or pytest's
    ``--hypothesis-profile=name``.
    """
    from hypothesis import HealthCheck, Verbosity, settings

    settings.register_profile(
        "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
        derandomize=True)
    settings.register_profile("dev", max_examples=300, deadline=None)
    settings.register_profile("debug", max_examples=20, deadline=None,
                              verbosity=Verbosity.verbose)


register_profiles()


# -- small elementwise programs ------------------------------------------------------------------

#: The element types of :func:`elementwise_programs` by default, with their StableHLO names.
PROGRAM_DTYPES: dict[np.dtype, str] = {
    np.dtype(np.bool_): "i1", np.dtype(np.int8): "i8", np.dtype(np.int32): "i32",
    np.dtype(np.uint8): "ui8", np.dtype(np.uint32): "ui32", np.dtype(np.float32): "f32",
    np.dtype(ml_dtypes.bfloat16): "bf16",
}

_BINARY_OPS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
               "maximum": np.maximum, "minimum": np.minimum}
_BITWISE_OPS = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}
_COMPARISONS = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                "GT": np.greater, "GE": np.greater_equal}


def _ops_for(dtype: np.dtype) -> list[str]:
    if dtype == np.bool_:
        return ["and", "or", "xor", "not"]
    ops = [*_BINARY_OPS, "negate", "select"]
    if dtype.kind in "iu":
        ops += [*_BITWISE_OPS, "not"]
    if dtype.kind in "if" or dtype == np.dtype(ml_dtypes.bfloat16):
        ops.append("abs")
    return ops


class ElementwiseProgram:
    """A small StableHLO program of elementwise ops on same-typed tensors, with its NumPy
    meaning.

    ``text`` is the module (``module @elementwise``, ``main`` taking ``num_args``
    parameters of ``dtype[shape]``); over several devices its parameters and results
    carry ``mhlo.sharding`` attributes (``arg_shardings``/``result_shardings``, HLO
    sharding text). ``steps`` are ``(op, operand indices, comparison)`` over the values
    (parameters first, then each step's result); ``outputs`` index those values.
    :meth:`evaluate` computes the results with NumPy; :meth:`assert_matches` compares
    (exactly for integers and bools, with a tolerance for floats).
    """

    def __init__(self, dtype, shape, num_args: int, steps, outputs, num_devices: int = 1,
                 arg_shardings=None, result_shardings=None):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.num_args = num_args
        self.steps = tuple(steps)
        self.outputs = tuple(outputs)
        self.num_devices = num_devices
        self.arg_shardings = tuple(arg_shardings or (None,) * num_args)
        self.result_shardings = tuple(result_shardings or (None,) * len(self.outputs))
        self.text = self._text()

    def _tensor(self, element: str | None = None) -> str:
        element = element or PROGRAM_DTYPES[self.dtype]
        return "tensor<" + "".join(f"{d}x" for d in self.shape) + element + ">"

    def _text(self) -> str:
        t = self._tensor()
        pred = self._tensor("i1")

        def attr(sharding):
            return f' {{mhlo.sharding = "{sharding}"}}' if sharding else ""

        params = ", ".join(f"%v{i}: {t}{attr(s)}" for i, s in enumerate(self.arg_shardings))
        results = ", ".join(f"{t}{attr(s)}" for s in self.result_shardings)
        lines = []
        for k, (op, operands, comparison) in enumerate(self.steps):
            v = f"%v{self.num_args + k}"
            a = [f"%v{i}" for i in operands]
            if op == "select":
                lines.append(f'%p{k} = "stablehlo.compare"({a[0]}, {a[1]}) {{comparison_direction'
                             f' = #stablehlo<comparison_direction {comparison}>}} : ({t}, {t}) '
                             f'-> {pred}')
                lines.append(f'{v} = "stablehlo.select"(%p{k}, {a[0]}, {a[1]}) : ({pred}, {t}, '
                             f'{t}) -> {t}')
            else:
                lines.append(f"{v} = stablehlo.{op} {', '.join(a)} : {t}")
        returns = ", ".join(f"%v{i}" for i in self.outputs)
        lines.append(f"return {returns} : {', '.join([t] * len(self.outputs))}")
        body = "".join(f"    {line}\n" for line in lines)
        return (f"module @elementwise {{\n  func.func public @main({params}) -> ({results}) {{\n"
                f"{body}  }}\n}}\n")

    def evaluate(self, *args: np.ndarray) -> list[np.ndarray]:
        """The results, computed by NumPy from the host arrays ``args``."""
        values = [np.asarray(a, self.dtype) for a in args]
        boolean = self.dtype == np.bool_
        for op, operands, comparison in self.steps:
            a = [values[i] for i in operands]
            if op in _BINARY_OPS:
                out = _BINARY_OPS[op](*a)
            elif op in _BITWISE_OPS:
                out = _BITWISE_OPS[op](*a)
            elif op == "not":
                out = np.logical_not(a[0]) if boolean else np.invert(a[0])
            elif op == "negate":
                out = np.negative(a[0])
            elif op == "abs":
                out = np.abs(a[0])
            else:  # select(compare(a, b), a, b)
                out = np.where(_COMPARISONS[comparison](a[0], a[1]), a[0], a[1])
            values.append(np.asarray(out).astype(self.dtype))
        return [values[i] for i in self.outputs]

    def assert_matches(self, actual: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                       what: str = "") -> None:
        """Results equal: exactly for integers and bools, within float tolerance (NaNs
        equal, -0 == 0) for floats (bfloat16 more loosely: XLA may keep excess precision
        between ops)."""
        assert len(actual) == len(expected), what
        for i, (a, e) in enumerate(zip(actual, expected)):
            a = np.asarray(a)
            assert a.dtype == self.dtype and a.shape == self.shape, (what, i, a.dtype, a.shape)
            if self.dtype.kind in "biu":
                np.testing.assert_array_equal(a, e, err_msg=f"{what} result {i}")
            else:
                tol = 2e-2 if self.dtype == np.dtype(ml_dtypes.bfloat16) else 1e-5
                np.testing.assert_allclose(a.astype(np.float64), np.asarray(e).astype(np.float64),
                                           rtol=tol, atol=tol, equal_nan=True,
                                           err_msg=f"{what} result {i}")

    def __repr__(self) -> str:
        return f"ElementwiseProgram(\n{self.text})"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def hlo_sharding_texts(draw, shape: Sequence[int], num_devices: int) -> str:
    """An XLA HloSharding text for ``shape`` over ``num_devices`` devices: replicated, or
    tiled evenly (each dim cut into pieces that divide it) with the devices in a random
    order and the devices left over replicating the tiles (``last_tile_dim_replicate``)."""
    tiles, left = [], num_devices
    for side in shape:
        choices = [t for t in _divisors(max(side, 1)) if left % t == 0] if side else [1]
        t = draw(st.sampled_from(choices))
        tiles.append(t)
        left //= t
    if math.prod(tiles) == 1:
        return "{replicated}"
    order = draw(st.permutations(range(num_devices)))
    dims = tiles + ([left] if left > 1 else [])
    suffix = " last_tile_dim_replicate" if left > 1 else ""
    return f"{{devices=[{','.join(map(str, dims))}]{','.join(map(str, order))}{suffix}}}"


@st.composite
def elementwise_programs(draw, num_devices: int = 1, dtypes: Sequence | None = None,
                         max_rank: int = 2, max_side: int = 4, max_args: int = 3,
                         max_steps: int = 4, max_outputs: int = 2) -> ElementwiseProgram:
    """A small :class:`ElementwiseProgram` (one dtype of ``dtypes``, default
    :data:`PROGRAM_DTYPES`; 1..``max_args`` parameters; 1..``max_steps`` elementwise ops,
    compare+select included; 1..``max_outputs`` results). With ``num_devices > 1`` each
    parameter and result carries an even ``mhlo.sharding`` over that many devices."""
    dtype = np.dtype(draw(st.sampled_from(list(dtypes or PROGRAM_DTYPES))))
    shape = draw(shapes(max_rank=max_rank, max_side=max_side, min_rank=1))
    num_args = draw(st.integers(1, max_args))
    ops = _ops_for(dtype)
    steps = []
    for k in range(draw(st.integers(1, max_steps))):
        op = draw(st.sampled_from(ops))
        arity = 1 if op in ("not", "negate", "abs") else 2
        operands = tuple(draw(st.integers(0, num_args + k - 1)) for _ in range(arity))
        comparison = draw(st.sampled_from(sorted(_COMPARISONS))) if op == "select" else None
        steps.append((op, operands, comparison))
    count = num_args + len(steps)
    outputs = draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=max_outputs))
    outputs[-1] = count - 1  # the last step is always used
    arg_shardings = result_shardings = None
    if num_devices > 1:
        arg_shardings = [draw(hlo_sharding_texts(shape, num_devices)) for _ in range(num_args)]
        result_shardings = [draw(hlo_sharding_texts(shape, num_devices)) for _ in outputs]
    return ElementwiseProgram(dtype, shape, num_args, steps, outputs, num_devices,
                              arg_shardings, result_shardings)


@st.composite
def program_arguments(draw, program: ElementwiseProgram) -> list[np.ndarray]:
    """Host arrays for ``program``'s parameters: any values for integers and bools,
    finite floats of moderate size (no subnormals, which some runtimes flush) for
    floats."""
    dtype, shape = program.dtype, program.shape
    args = []
    for _ in range(program.num_args):
        if dtype.kind in "biu":
            args.append(draw(host_arrays(dtype, shape)))
        else:
            n = math.prod(shape)
            values = draw(st.lists(st.floats(-1e3, 1e3, width=32, allow_subnormal=False),
                                   min_size=n, max_size=n))
            args.append(np.array(values, np.float32).astype(dtype).reshape(shape))
    return args
