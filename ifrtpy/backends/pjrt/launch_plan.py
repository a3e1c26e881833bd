"""The launch plan of a PjRt executable: what every launch of it reads, worked out once,
when the executable is made, from one parse of the optimized module the plugin returns.

* the compiled parameter and output shardings (read from the module where the program is
  partitioned; each checked against the per-device shapes the module takes and returns);
* the compiled parameter and output layouts (None where the plugin returns no HLO);
* which arguments need no layout read by the layout rule of a launch (PJRT compares only
  byte sizes: an argument in another layout than its parameter's would be read wrongly;
  the rule is the launch's, ``_execute_launch``): those in the default layout of their memory
  where the parameter's layout is that, and every one on a host platform;
* the type of each output and the layout it is made with (None where it is the default of
  its memory);
* the arguments the program donates, the ordered effects it threads, whether the C path
  may repeat calls of the kinds a checked call had (an executable bound to devices,
  without ordered effects), and the platform's limit of executions in flight per device
  (:mod:`.execute_limits`).
"""

from __future__ import annotations

from typing import Any

from ifrtpy import _jaxlib, _xla
from ifrtpy.array_plans import canonical_kind, default_shard_layout
from ifrtpy.backends.pjrt.effects import OrderedEffects
from ifrtpy.backends.pjrt.execute_limits import max_executions_per_device
from ifrtpy.backends.pjrt.layouts import packed
from ifrtpy.device import DeviceList
from ifrtpy.errors import InternalError, UnimplementedError
from ifrtpy.layout import Layout
from ifrtpy.program import HloProgram
from ifrtpy.sharding import ConcreteEvenSharding, HloSharding, Sharding, SingleDeviceSharding

__all__ = ["LaunchPlan", "optimized_module"]


def optimized_module(handle: Any) -> Any:
    """The compiled module the plugin returns (a jaxlib HloModule), or None for a format
    other than HLO."""
    fmt, code = handle.optimized_program()
    if fmt == "hlo_with_config":
        code = _xla.proto_field(code, 1)  # HloModuleProtoWithConfig.hlo_module
    elif fmt != "hlo":
        return None
    return _jaxlib.hlo_module_class().from_serialized_hlo_module_proto(code)


class LaunchPlan:
    """What every launch of the executable of ``handle`` (``program`` on ``devices``, None
    for a portable one) reads. UnimplementedError from the plugin's optimized program is
    taken as "no HLO" where the shardings do not need it (one device, or portable)."""

    __slots__ = ("parameter_shardings", "output_shardings", "parameter_layouts",
                 "output_layouts", "output_types", "output_layouts_made", "host",
                 "parameters_in_default_layouts", "parameter_memory_kinds", "donated",
                 "effects", "repeatable", "max_executions", "unread_module")

    def __init__(self, client: Any, handle: Any, program: HloProgram, devices: DeviceList | None):
        bound_to_many = devices is not None and len(devices) > 1
        #: Why there is no module to read layouts from: the plugin's UnimplementedError
        #: (a plugin without PJRT_Executable_OptimizedProgram), else None.
        self.unread_module: UnimplementedError | None = None
        try:
            module = optimized_module(handle)
        except UnimplementedError as e:
            if bound_to_many:
                raise
            module, self.unread_module = None, e
        shapes = _xla.entry_shapes(module) if module is not None else None
        params, outputs = _shardings(handle.name, program, devices, module, shapes)
        #: The sharding each argument must have, each output has; None for a portable
        #: executable (its execute device's).
        self.parameter_shardings: list[Sharding] | None = params
        self.output_shardings: list[Sharding] | None = outputs
        #: The compiled layout of each parameter and output; None where the plugin returns
        #: no HLO, or another entry signature (tuples).
        self.parameter_layouts, self.output_layouts = _layouts(program, shapes)
        #: The (dtype, shape) of each output.
        self.output_types = tuple((r.dtype, r.shape) for r in program.results)
        #: Whether the plugin holds every array row-major (the CPU plugin): no layout to compare.
        self.host: bool = client._host_platform
        # The shardings whose memories' default layouts are compared: the compiled ones, or a
        # portable executable's on the client's first device (a platform's devices agree).
        if params is None or outputs is None:
            first = SingleDeviceSharding(client.addressable_devices()[0])
            params, outputs = [first] * len(program.parameters), [first] * len(program.results)
        #: Per parameter, whether its compiled layout is the default layout of its memory
        #: (then an argument in that memory in its default layout needs no layout read;
        #: None where nothing is known), and that memory's kind.
        self.parameters_in_default_layouts: tuple[bool, ...] | None = None
        self.parameter_memory_kinds = tuple(canonical_kind(s) for s in params)
        if self.parameter_layouts is not None and not self.host:
            self.parameters_in_default_layouts = tuple(
                layout == default_shard_layout(client, p.dtype, p.shape, s)
                for layout, p, s in zip(self.parameter_layouts, program.parameters, params))
        #: The layout each output array is made with: None where it is the default of its memory.
        self.output_layouts_made: tuple[Layout | None, ...] = (None,) * len(program.results)
        if self.output_layouts is not None:
            self.output_layouts_made = tuple(
                None if layout == default_shard_layout(client, r.dtype, r.shape, s) else layout
                for layout, r, s in zip(self.output_layouts, program.results, outputs))
        #: The arguments the program donates.
        self.donated = frozenset(program.donated_inputs)
        #: The token parameters and results threaded between executes; None without.
        self.effects = (OrderedEffects(client, program)
                        if program.token_parameters or program.token_results else None)
        #: Whether the C path may repeat calls of the kinds a checked call had.
        self.repeatable = devices is not None and self.effects is None
        #: The most executions the plugin runs at once per device (None: not known), the
        #: limit of executes made inside host callbacks.
        self.max_executions = max_executions_per_device(client.platform_name)


def _shardings(name: str, program: HloProgram, devices: DeviceList | None, module: Any,
               shapes: Any) -> tuple[list[Sharding] | None, list[Sharding] | None]:
    if devices is None:
        return None, None  # portable: the sharding is the execute device
    if len(devices) == 1:
        single = SingleDeviceSharding(devices[0])
        return [single] * len(program.parameters), [single] * len(program.results)
    params, outputs = _hlo_module_shardings(module)
    if params is not None and outputs is not None:  # without token parameters and results
        params = [p for i, p in enumerate(params) if i not in program.token_parameters]
        outputs = [o for i, o in enumerate(outputs) if i not in program.token_results]
        if not program.results:  # the empty result tuple's sharding is no output's
            outputs = []
    if params is None or outputs is None:  # not partitioned: every device holds it whole
        def whole(types):
            return [ConcreteEvenSharding(devices, t.shape, t.shape, is_fully_replicated=True)
                    for t in types]
        return whole(program.parameters), whole(program.results)
    param_shardings: list[Sharding] = [HloSharding(devices, p) for p in params]
    output_shardings: list[Sharding] = [HloSharding(devices, o) for o in outputs]
    _check_shard_shapes(name, shapes, program, param_shardings, output_shardings)
    return param_shardings, output_shardings


def _hlo_module_shardings(module: Any) -> tuple[list | None, list | None]:
    """OpShardings of the parameters and outputs of the compiled (SPMD) ``module``, or
    None, None where it is not partitioned (it has no output sharding then; a partitioned
    module without parameters has no parameter shardings either)."""
    output = None if module is None else module.spmd_output_sharding
    if output is None:
        return None, None
    output = list(output.tuple_shardings) if output.type == output.type.TUPLE else [output]
    return list(module.spmd_parameters_shardings or ()), output


def _check_shard_shapes(name: str, shapes: Any, program: HloProgram, params, outputs) -> None:
    """Each sharding read from the compiled module gives the per-device shape the module
    takes or returns (``shapes``). A sharding misread (a form of HloSharding ifrtpy does
    not know) would size buffers wrongly, which the plugin does not check: refuse the
    program instead."""
    for what, types, shardings, compiled, tokens in (
            ("parameter", program.parameters, params, shapes[0], program.token_parameters),
            ("output", program.results, outputs, shapes[1], program.token_results)):
        compiled = [s for i, s in enumerate(compiled) if i not in tokens]
        if len(compiled) != len(types):
            continue  # another entry signature (tuples): no shape to compare with
        for i, (t, sharding, shape) in enumerate(zip(types, shardings, compiled)):
            expected = tuple(sharding.shard_shape(t.shape).dims)
            if shape.is_array() and shape.is_static() and tuple(shape.dimensions()) != expected:
                raise InternalError(
                    f"{what} {i} of {name}: ifrtpy reads its compiled sharding as {sharding}, "
                    f"shards of shape {list(expected)}, but the compiled program's are "
                    f"{list(shape.dimensions())}; this jaxlib writes a sharding form ifrtpy "
                    "does not read (please report it)")


def _layouts(program: HloProgram, shapes: Any) -> tuple[list[Layout] | None, list[Layout] | None]:
    """The compiled layouts of the parameters and outputs (their sub-byte element sizes
    filled in), from the module's entry ``shapes``; None, None without them or where the
    entry signature is another (tuples)."""
    if shapes is None:
        return None, None
    # Tokens have no layout (and jaxlib's Shape.layout() of one aborts the process).
    params = [_xla.layout_of(s) for s in shapes[0] if s.is_array()]
    outputs = [_xla.layout_of(s) for s in shapes[1] if s.is_array()]
    if len(params) != len(program.parameters) or len(outputs) != len(program.results):
        return None, None
    return ([packed(layout, p.dtype) for layout, p in zip(params, program.parameters)],
            [packed(layout, r.dtype) for layout, r in zip(outputs, program.results)])
