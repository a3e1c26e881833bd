"""``HloProgram``: a StableHLO module, and what a backend needs to know of it.

An HloProgram is made from any front end :mod:`ifrtpy.program.inputs` lists (StableHLO
or HLO text, MLIR bytecode or a portable artifact, a serialized HloModuleProto, a jaxlib
MLIR module or XlaComputation, jax Lowered/Compiled/Exported stages, TensorFlow through
:func:`from_tensorflow`); all become StableHLO text. It parses the module once, with
jaxlib's MLIR bindings, to read the signature of ``main`` (global parameter and result
types), the donated parameters (``jax.buffer_donor`` or ``tf.aliasing_output``), whether
the module uses the Shardy dialect, the custom calls it makes, and the host transfers
(infeed, outfeed, send and recv to or from the host) that only a host feeding or draining
them lets finish.

Host callbacks: a jax ``Lowered`` stage (or the builder) hands its program the Python
callables of its ``pure_callback``/``io_callback``/``jax.debug.print`` calls
(:attr:`HloProgram.host_callbacks`, IFRT's host callbacks, called by ``index``); text and
bytes cannot carry them. Programs with ordered effects take and return
``!stablehlo.token`` values: they are not among :attr:`~HloProgram.parameters` and
:attr:`~HloProgram.results` (the arrays a caller passes and gets); the backend threads
them from one execute to the next (:attr:`~HloProgram.token_parameters`).

Version negotiation: :meth:`HloProgram.serialize_for` produces a portable artifact
targeted at the consumer's StableHLO version, which an older compiler can read, its CHLO
ops expanded into StableHLO first and ``stablehlo.fma`` rewritten for a version before it
(:mod:`ifrtpy.program.fma`); Shardy's (``sdy``) ops and attributes travel in it as plain
MLIR bytecode beside the versioned StableHLO.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ifrtpy.program import inputs, mlir
from ifrtpy.program.mlir import ELEMENT_TYPES, stablehlo_version
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import Shape

__all__ = ["Program", "HloProgram", "TensorType", "from_tensorflow", "HOST_CALLBACK_TARGETS",
           "CPU_HOST_CALLBACK_TARGETS"]

#: The custom call targets jax lowers host callbacks on CPU to: the ones ifrtpy's handler
#: serves (the only place these names are written).
CPU_HOST_CALLBACK_TARGETS = frozenset({
    "xla_ffi_python_cpu_callback", "xla_ffi_partitioned_python_cpu_callback",
})

#: The custom call targets jax lowers host callbacks to (attribute ``index``: which of the
#: program's :attr:`HloProgram.host_callbacks` to call).
HOST_CALLBACK_TARGETS = CPU_HOST_CALLBACK_TARGETS | frozenset({
    "xla_ffi_python_gpu_callback", "xla_ffi_partitioned_python_gpu_callback",
})


@dataclasses.dataclass(frozen=True)
class TensorType:
    """The global dtype and shape of one parameter or result."""

    dtype: DType
    shape: Shape

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


def from_tensorflow(function: Any, *args: Any, **kwargs: Any) -> HloProgram:
    """An HloProgram of a ``tf.function(jit_compile=True)`` traced for ``args``, through
    TensorFlow's own compiler IR export (``experimental_get_compiler_ir``, stage
    ``hlo_serialized``). Needs TensorFlow; InvalidArgumentError for other functions."""
    return HloProgram(inputs.tensorflow_hlo(function, *args, **kwargs))


class Program:
    """Base of the programs a Compiler accepts."""


class HloProgram(Program):
    """A StableHLO module (see the module docstring for what it can be made from).

    Immutable. ``text`` is the module as StableHLO text; ``parameters`` and ``results``
    the global types of ``main``'s arrays; ``donated_inputs`` the parameters the program
    may donate; ``uses_shardy`` whether it carries Shardy shardings;
    ``custom_call_targets`` the targets it calls; ``host_callbacks`` the Python callables
    of its host callbacks: those of a jax ``Lowered`` stage, or ``host_callbacks`` given
    (a sequence of callables, each taking and returning what jax's wrapped callbacks do).
    """

    def __init__(self, program: Any, host_callbacks: Sequence[Any] | None = None):
        carried: tuple[Any, ...] = ()
        if isinstance(program, HloProgram):
            program, carried = program.text, program.host_callbacks
        else:
            carried = inputs.host_callbacks(program)
        if host_callbacks is not None:
            carried = tuple(host_callbacks)
            for i, fn in enumerate(carried):
                if not callable(fn):
                    raise InvalidArgumentError(f"host callback {i} is not callable: {fn!r}")
        module = mlir.parse(inputs.stablehlo_text(program))
        self._host_callbacks = carried
        with mlir.context():
            self._text = module.operation.get_asm(enable_debug_info=True)
            self._read(module)

    def _read(self, module) -> None:
        from jaxlib.mlir import ir

        attributes = module.operation.attributes
        self._name = (ir.StringAttr(attributes["sym_name"]).value
                      if "sym_name" in attributes else "main")
        main = None
        self._uses_shardy = _uses_shardy(module.operation)
        self._targets, self._callback_indices, self._host_transfers = _calls(module.operation)
        for op in module.body.operations:
            if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
                main = op
        if main is None:
            raise InvalidArgumentError("the StableHLO module has no function named main")
        function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        self._token_parameters = _tokens(function_type.inputs)
        self._token_results = _tokens(function_type.results)
        self._parameters = tuple(_tensor_type(t, "parameter", i) for i, t in enumerate(function_type.inputs)
                                 if i not in self._token_parameters)
        self._results = tuple(_tensor_type(t, "result", i) for i, t in enumerate(function_type.results)
                              if i not in self._token_results)
        self._layout_modes = (
            _layout_modes(main, "arg_attrs", len(function_type.inputs), self._token_parameters),
            _layout_modes(main, "res_attrs", len(function_type.results), self._token_results))
        arrays = [i for i in range(len(function_type.inputs)) if i not in self._token_parameters]
        donated = set()
        if "arg_attrs" in main.attributes:
            for i, attrs in enumerate(ir.ArrayAttr(main.attributes["arg_attrs"])):
                attrs = ir.DictAttr(attrs)
                if i in self._token_parameters:
                    continue
                if "tf.aliasing_output" in attrs:
                    donated.add(arrays.index(i))
                elif "jax.buffer_donor" in attrs and ir.BoolAttr(attrs["jax.buffer_donor"]).value:
                    donated.add(arrays.index(i))
        self._donated = frozenset(donated)

    @property
    def text(self) -> str:
        return self._text

    @property
    def name(self) -> str:
        """The module's name (``module @name``), or "main"."""
        return self._name

    @property
    def parameters(self) -> tuple[TensorType, ...]:
        return self._parameters

    @property
    def results(self) -> tuple[TensorType, ...]:
        return self._results

    @property
    def donated_inputs(self) -> frozenset[int]:
        return self._donated

    @property
    def layout_modes(self) -> tuple[tuple[str | None, ...], tuple[str | None, ...]]:
        """The ``mhlo.layout_mode`` of each parameter and result (tokens left out), as jax
        writes it: an XLA layout (``"{0,1}"``), ``"default"`` or ``"auto"``; None where the
        program names none. A compiler lays the value out so where its options do not."""
        return self._layout_modes

    @property
    def uses_shardy(self) -> bool:
        return self._uses_shardy

    @property
    def custom_call_targets(self) -> frozenset[str]:
        """The ``call_target_name`` of every custom call in the module."""
        return self._targets

    @property
    def host_transfers(self) -> frozenset[str]:
        """The names of the ops that move data between the program and the host outside its
        parameters and results (``stablehlo.infeed``, ``stablehlo.outfeed``, and
        ``stablehlo.send``/``recv`` with ``is_host_transfer``): a run waits on them until
        the host feeds or drains them, which ifrtpy's execute has no way to do."""
        return self._host_transfers

    @property
    def host_callbacks(self) -> tuple[Any, ...]:
        """The Python callables of the program's host callbacks, by ``index`` (empty where
        the program came as text or bytes, which cannot carry them)."""
        return self._host_callbacks

    @property
    def host_callback_indices(self) -> frozenset[int]:
        """The ``index`` of each host callback call (:data:`HOST_CALLBACK_TARGETS`)."""
        return self._callback_indices

    @property
    def token_parameters(self) -> tuple[int, ...]:
        """The positions of ``main``'s ``!stablehlo.token`` parameters (ordered effects),
        which :attr:`parameters` leaves out."""
        return self._token_parameters

    @property
    def token_results(self) -> tuple[int, ...]:
        """The positions of ``main``'s ``!stablehlo.token`` results."""
        return self._token_results

    def serialize_for(self, target_version: Sequence[int] | None) -> tuple[bytes, str]:
        """``(code, how)``: a portable artifact for StableHLO ``target_version`` (capped at
        jaxlib's own version; CHLO ops expanded into StableHLO, ``fma`` rewritten for a
        version before it, Shardy's ops and attributes kept beside the versioned ones), or
        the text where that is impossible (no target, or a module the version cannot
        hold; ``fma`` rewritten there too), with nothing printed. ``how`` says which:
        "bytecode <version>" or "text"."""
        if target_version is None:
            return self._text.encode(), "text"
        target = min(tuple(target_version), stablehlo_version())
        version = ".".join(map(str, target))
        code = mlir.portable_artifact(self._text, version)
        if code is None:  # it needs a newer version
            return mlir.text_for_version(self._text, version).encode(), "text"
        return code, f"bytecode {version}"

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        params = ", ".join(map(str, self._parameters))
        results = ", ".join(map(str, self._results))
        return f"<HloProgram {self._name}({params}) -> ({results})>"


def _uses_shardy(operation) -> bool:
    """Whether any op is a Shardy op or carries a Shardy attribute (a mesh, shardings on
    arguments or results, constraints in the body); names in strings do not count."""
    from jaxlib.mlir import ir

    def get(container, key):
        # jaxlib's bindings cannot convert some attributes (a dense complex constant): a
        # TypeError when looked up by key (NamedAttribute.attr would abort the process).
        # Such an attribute is not a Shardy one.
        try:
            return container[key]
        except TypeError:
            return None

    def shardy_attribute(attribute) -> bool:
        if isinstance(attribute, ir.ArrayAttr):
            return any(shardy_attribute(get(attribute, i)) for i in range(len(attribute)))
        if isinstance(attribute, ir.DictAttr):
            names = [attribute[i].name for i in range(len(attribute))]
            return any(n.startswith("sdy.") or shardy_attribute(get(attribute, n)) for n in names)
        return attribute is not None and str(attribute).startswith("#sdy.")

    if operation.name.startswith("sdy."):
        return True
    attributes = operation.attributes
    if any(name.startswith("sdy.") or shardy_attribute(get(attributes, name)) for name in attributes):
        return True
    return any(_uses_shardy(op.operation)
               for region in operation.regions for block in region for op in block)


#: Ops that always move data to or from the host (the mhlo spellings too).
_FEEDS = frozenset(f"{dialect}.{name}" for dialect in ("stablehlo", "mhlo")
                   for name in ("infeed", "outfeed"))
#: Ops that move data to or from the host when marked ``is_host_transfer``.
_TRANSFERS = frozenset(f"{dialect}.{name}" for dialect in ("stablehlo", "mhlo")
                       for name in ("send", "recv"))


def _calls(operation) -> tuple[frozenset[str], frozenset[int], frozenset[str]]:
    """The targets of the custom calls under ``operation``, the ``index`` attribute of each
    host callback among them, and the names of its host transfer ops."""
    from jaxlib.mlir import ir

    targets: set[str] = set()
    indices: set[int] = set()
    transfers: set[str] = set()

    def walk(op) -> None:
        if op.name in ("stablehlo.custom_call", "mhlo.custom_call"):
            attributes = op.attributes
            target = ir.StringAttr(attributes["call_target_name"]).value
            targets.add(target)
            if target in HOST_CALLBACK_TARGETS:
                indices.add(_callback_index(attributes, target))
        elif op.name in _FEEDS or (op.name in _TRANSFERS and _is_host_transfer(op)):
            transfers.add(op.name)
        for region in op.regions:
            for block in region:
                for inner in block:
                    walk(inner.operation)

    walk(operation)
    return frozenset(targets), frozenset(indices), frozenset(transfers)


def _is_host_transfer(op) -> bool:
    """Whether a send or recv goes to or from the host (``is_host_transfer``; the verifier
    keeps its channel type in agreement)."""
    from jaxlib.mlir import ir

    attributes = op.attributes
    return "is_host_transfer" in attributes and ir.BoolAttr(attributes["is_host_transfer"]).value


def _callback_index(attributes, target: str) -> int:
    """The u64 ``index`` of a host callback call (in ``mhlo.backend_config``, or a
    dictionary ``backend_config``)."""
    from jaxlib.mlir import ir

    for key in ("mhlo.backend_config", "backend_config"):
        if key in attributes and isinstance(attributes[key], ir.DictAttr):
            config = ir.DictAttr(attributes[key])
            if "index" in config and isinstance(config["index"], ir.IntegerAttr):
                return ir.IntegerAttr(config["index"]).value
    raise InvalidArgumentError(f"a custom call to {target} has no integer attribute `index`")


def _layout_modes(main: Any, key: str, count: int, tokens: Any) -> tuple[str | None, ...]:
    """The ``mhlo.layout_mode`` attribute of each of ``count`` values in ``main``'s
    ``key`` (``arg_attrs`` or ``res_attrs``), the ``tokens`` among them left out."""
    from jaxlib.mlir import ir

    modes: list[str | None] = [None] * count
    if key in main.attributes:
        for i, attrs in enumerate(ir.ArrayAttr(main.attributes[key])):
            attrs = ir.DictAttr(attrs)
            if "mhlo.layout_mode" in attrs:
                modes[i] = ir.StringAttr(attrs["mhlo.layout_mode"]).value
    return tuple(mode for i, mode in enumerate(modes) if i not in tokens)


def _tokens(types) -> tuple[int, ...]:
    from jaxlib.mlir.dialects import stablehlo

    return tuple(i for i, t in enumerate(types) if stablehlo.TokenType.isinstance(t))


def _tensor_type(mlir_type, what: str, index: int) -> TensorType:
    from jaxlib.mlir import ir

    if not isinstance(mlir_type, ir.RankedTensorType):
        raise InvalidArgumentError(f"{what} {index} of main has type {mlir_type}; ifrtpy needs ranked tensors")
    tensor = ir.RankedTensorType(mlir_type)
    element = str(tensor.element_type)
    kind = ELEMENT_TYPES.get(element)
    if kind is None:
        raise InvalidArgumentError(f"{what} {index} of main has element type {element}, which has no XLA kind")
    if not tensor.has_static_shape:
        raise InvalidArgumentError(f"{what} {index} of main has a dynamic shape {tensor}")
    return TensorType(DType(kind), Shape(tensor.shape))
