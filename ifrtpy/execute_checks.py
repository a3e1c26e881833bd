"""The contract of :meth:`ifrtpy.LoadedExecutable.execute`, written once for every
backend: :class:`ExecuteContract` checks a call and returns it as a
:class:`CheckedExecute` for the backend to launch; its pieces (the devices, the argument
count, each argument's liveness, value and placement) are functions of their own, and
:class:`NamedOutputs` names the outputs' shardings after the arguments' meshes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from ifrtpy.array import GONE, Array, array_sequence, check_of_client
from ifrtpy.device import DeviceList
from ifrtpy.dtypes import DType
from ifrtpy.errors import (
    FailedPreconditionError, InternalError, InvalidArgumentError, UnimplementedError, check_type,
)
from ifrtpy.executable_options import ExecuteOptions
from ifrtpy.sharding import (
    NamedSharding, OpaqueSharding, Sharding, SingleDeviceShardSemantics, SingleDeviceSharding,
    same_unreduced,
)
from ifrtpy.sharding.mesh import named_sharding_like

if TYPE_CHECKING:
    from ifrtpy.device import Device
    from ifrtpy.executable import LoadedExecutable
    from ifrtpy.program import TensorType
    from ifrtpy.shape import Shape

__all__ = [
    "ExecuteContract", "CheckedExecute", "ArgumentChecks", "NamedOutputs",
    "check_execute_devices", "check_argument_count", "check_argument_live",
    "check_argument_value", "check_argument_placement", "same_domains", "donated_arguments",
]



def donated_arguments(donatable: frozenset[int], options: ExecuteOptions | None) -> frozenset[int]:
    """The arguments a call with ``options`` (None: the defaults) gives up, of the
    program's ``donatable`` ones: all but ``options.non_donatable_input_indices``. Worked
    out here only: the contract's :class:`CheckedExecute` carries it, a backend repeating
    a call of checked kinds with other options asks it again, and ``_pjrt`` is handed
    it."""
    if options is None or not donatable or not options.non_donatable_input_indices:
        return donatable
    return donatable - options.non_donatable_input_indices


def check_execute_devices(executable: LoadedExecutable, devices: Any) -> Device | None:
    """The device a portable ``executable`` runs on (``devices`` must be one addressable
    device of its client), or None for an executable bound to devices, which ``devices``
    (when given) must equal. InvalidArgumentError otherwise."""
    compiled = executable.devices()
    name = executable.name
    if devices is not None:
        devices = DeviceList(devices)
    if compiled is None:
        if devices is None or len(devices) != 1:
            raise InvalidArgumentError(
                f"{name} is a portable executable: execute it with devices= one device")
        device: Device = devices[0]
        if device.client is not executable.client or not device.is_addressable:
            raise InvalidArgumentError(f"device {device} is not an addressable device of this client")
        return device
    if devices is not None and devices != compiled:
        raise InvalidArgumentError(
            f"{name} is compiled for {compiled.to_string()}; execute got {devices.to_string()}")
    return None


def check_argument_count(name: str, args: Any, parameters: Sequence[Any]) -> list[Any]:
    """``args`` (a sequence, not one array) as a list of as many arguments as the program
    of executable ``name`` has ``parameters``; InvalidArgumentError otherwise."""
    checked = array_sequence(args, "args")
    if len(checked) != len(parameters):
        raise InvalidArgumentError(f"{name} takes {len(parameters)} arguments, got {len(checked)}")
    return checked


def check_argument_live(name: str, i: int, arg: Any) -> None:
    """Argument ``i`` of executable ``name`` (an array) is not an error array and not
    deleted."""
    if arg.error is not None:
        raise InvalidArgumentError(f"argument {i} of {name} is an error array: {arg.error}")
    if arg.is_deleted():
        raise InvalidArgumentError(f"argument {i} of {name} has been deleted or donated: {GONE}")


def check_argument_value(name: str, i: int, arg: Any, param: Any) -> None:
    """Argument ``i`` of executable ``name`` (an array of the right client) is usable for
    parameter ``param``: live (:func:`check_argument_live`), of its dtype and shape."""
    check_argument_live(name, i, arg)
    if arg.dtype != param.dtype or arg.shape != param.shape:
        raise InvalidArgumentError(
            f"argument {i} of {name} is {arg.dtype}{list(arg.shape)}, the program's "
            f"parameter {i} is {param}")


def check_argument_placement(name: str, i: int, arg: Any, param: Any, sharding: Sharding, *,
                             compare_domains: bool = True) -> None:
    """Argument ``i`` lies on the devices of the compiled parameter sharding and (with
    ``compare_domains``) holds the same shard on each device: as any argument in that very
    sharding does."""
    if arg.sharding == sharding:
        return
    reshard = (f"client.reshard_arrays([array], [ArraySpec(array.dtype, array.shape, "
               f"executable.parameter_shardings()[{i}])])")
    if arg.sharding.devices != sharding.devices:
        held, wanted = arg.sharding.devices, sharding.devices
        if len(held) == len(wanted) and set(held) == set(wanted):
            raise InvalidArgumentError(
                f"argument {i} of {name} is on the devices the executable runs on, but in "
                f"another order: {held.to_string()}, the executable's order is "
                f"{wanted.to_string()} (a mesh built in another device order?). "
                f"{reshard} moves it to the executable's "
                "order; or build the mesh in that order, or compile for the array's")
        move = (f"client.copy_arrays([array], devices=executable.devices()) copies it there"
                if len(held) == len(wanted) else f"{reshard} puts it there")
        raise InvalidArgumentError(
            f"argument {i} of {name} is on {held.to_string()}, the executable runs on "
            f"{wanted.to_string()}: {move}, or compile for the array's devices")
    if compare_domains and not same_domains(arg.sharding, sharding, param.shape):
        partial = arg.sharding.has_unreduced_axes or sharding.has_unreduced_axes
        raise InvalidArgumentError(
            f"argument {i} of {name} has sharding {arg.sharding!r}; the compiled "
            f"parameter {i} has sharding {sharding!r} ("
            + ("partial values on one side only)" if partial else
               f"different shards per device): {reshard} reshards it as the executable takes it"))


class ArgumentChecks:
    """The contract of execute for each argument, written once for every backend: an
    array of the executable's client (an instance of ``array_type``), not a STRING
    array, not an error array, not deleted, of its parameter's dtype and shape, on the
    devices of the parameter sharding and holding the same shard on each (not compared
    for an OpaqueSharding, which names no shards). The placement of an argument is
    worked out once per parameter, dtype, shape and sharding (the last ``ENTRIES``)."""

    ENTRIES = 256

    def __init__(self, name: str, client: Any, parameters: Sequence[TensorType],
                 array_type: type):
        self._name = name
        self._client = client
        self.parameters = list(parameters)
        self._array_type = array_type
        self._placed: dict[tuple[Any, ...], None] = {}

    def check(self, args: Any, shardings: Sequence[Sharding]) -> list[Any]:
        """``args`` as a list, each argument checked against its parameter placed by
        ``shardings``; InvalidArgumentError (UnimplementedError for a STRING array)
        naming the first argument that is not usable."""
        checked = check_argument_count(self._name, args, self.parameters)
        for i, (arg, sharding) in enumerate(zip(checked, shardings)):
            self.check_one(i, arg, sharding)
        return checked

    def check_one(self, i: int, arg: Any, sharding: Sharding) -> None:
        """Argument ``i`` checked against parameter ``i`` placed by ``sharding``."""
        name, param = self._name, self.parameters[i]
        if isinstance(arg, Array) and arg.dtype.kind == DType.Kind.STRING:
            raise UnimplementedError(
                f"argument {i} of {name} is a STRING array; XLA programs cannot take strings")
        check_of_client(self._client, arg, f"argument {i} of {name}", self._array_type)
        check_argument_value(name, i, arg, param)
        key = (i, arg.dtype, arg.shape, arg.sharding)
        if key in self._placed:
            return
        check_argument_placement(name, i, arg, param, sharding,
                                 compare_domains=not isinstance(sharding, OpaqueSharding))
        if len(self._placed) >= self.ENTRIES:
            self._placed.clear()
        self._placed[key] = None


class CheckedExecute(NamedTuple):
    """One call of execute, its contract checked (:meth:`ExecuteContract.check`)."""

    #: The arguments, each checked against its parameter.
    args: list[Any]
    #: The call's options (the defaults for None).
    options: ExecuteOptions
    #: The device a portable executable runs on; None for one bound to devices.
    device: Device | None
    #: The arguments the call gives up: donatable, not in the options' non-donatable ones.
    donated: frozenset[int]
    #: The sharding of each output (named as the arguments' meshes); None where unknown.
    output_shardings: list[Sharding] | None


class ExecuteContract:
    """The contract of :meth:`LoadedExecutable.execute`, written once for every backend:
    the executable is not deleted; ``options`` is an ExecuteOptions or None (the
    defaults); ``devices`` is a portable executable's one addressable device, or else
    None or the compiled devices; there are as many arguments as ``parameters``, each
    checked by :class:`ArgumentChecks` against its parameter placed by
    ``parameter_shardings`` (a portable executable's: its device); and the call donates
    the ``donatable`` arguments that ``options.non_donatable_input_indices`` leaves.

    ``parameters`` None is a program whose parameter types the backend does not know
    (e.g. a Python function): each argument is then checked to be a live array of the
    client, and nothing is donated. ``output_shardings`` (None where unknown) are named
    after the arguments' meshes (:class:`NamedOutputs`)."""

    def __init__(self, name: str, client: Any, array_type: type,
                 parameters: Sequence[TensorType] | None,
                 parameter_shardings: Sequence[Sharding] | None = None,
                 results: Sequence[TensorType] = (),
                 output_shardings: Sequence[Sharding] | None = None,
                 donatable: frozenset[int] = frozenset()):
        self._name = name
        self._client = client
        self._array_type = array_type
        self._parameter_shardings = (None if parameter_shardings is None
                                     else list(parameter_shardings))
        self._results = list(results)
        self._donatable = frozenset(donatable)
        self.arguments = (None if parameters is None
                          else ArgumentChecks(name, client, parameters, array_type))
        self.named_outputs = (None if output_shardings is None
                              else NamedOutputs(output_shardings, results))

    def check(self, executable: LoadedExecutable, args: Any, options: Any,
              devices: Any) -> CheckedExecute:
        """The call ``executable.execute(args, options, devices)`` checked; the first
        broken rule raises (FailedPreconditionError for a deleted executable,
        InvalidArgumentError naming the argument or option otherwise)."""
        if executable.is_deleted():
            raise FailedPreconditionError(f"executable {self._name!r} has been deleted")
        if options is None:
            options = _DEFAULT_EXECUTE_OPTIONS
        elif type(options) is not ExecuteOptions:
            check_type(options, ExecuteOptions, "options", "an ExecuteOptions or None")
        device = check_execute_devices(executable, devices)
        if self.arguments is None:
            checked = array_sequence(args, "args")
            for i, arg in enumerate(checked):
                check_of_client(self._client, arg, f"argument {i} of {self._name}",
                                self._array_type)
                check_argument_live(self._name, i, arg)
            return CheckedExecute(checked, options, device, frozenset(), None)
        shardings = self._parameter_shardings
        if device is not None:  # portable: every parameter and output on that device
            single = SingleDeviceSharding(device)
            shardings = [single] * len(self.arguments.parameters)
            outputs: list[Sharding] | None = [single] * len(self._results)
        elif shardings is None:  # only a portable executable has none, and it has a device
            raise InternalError(f"{self._name}: a bound executable without parameter shardings")
        checked = self.arguments.check(args, shardings)
        if device is None:
            outputs = None if self.named_outputs is None else self.named_outputs(checked)
        return CheckedExecute(checked, options, device,
                              donated_arguments(self._donatable, options), outputs)


_DEFAULT_EXECUTE_OPTIONS = ExecuteOptions()


def _holds_whole(sharding: Sharding, shape: Shape) -> bool:
    """Whether every device of ``sharding`` holds the whole array."""
    if sharding.is_fully_replicated:
        return True
    try:
        return sharding.shard_shape(shape) == shape
    except InvalidArgumentError:
        return False


def same_domains(a: Sharding, b: Sharding, shape: Shape) -> bool:
    """Whether ``a`` and ``b`` put the same values of an array of ``shape`` on each
    (addressable) device: the same partial values or none (:func:`same_unreduced`), and
    both hold the whole array everywhere or their index domains match."""
    if not same_unreduced(a, b):
        return False
    if _holds_whole(a, shape) and _holds_whole(b, shape):
        return True
    semantics = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
    try:
        return list(a.index_domains(shape, semantics)) == list(b.index_domains(shape, semantics))
    except InvalidArgumentError:
        return False


class NamedOutputs:
    """The output shardings of an executable for arguments of given shardings, as jax
    names them: a compiled output sharding that is a NamedSharding over the mesh of an
    argument's NamedSharding becomes that NamedSharding (axis names included); the others
    stay as compiled. Worked out once per tuple of argument shardings (the last
    ``ENTRIES``), so that a repeated execute pays one dict lookup."""

    ENTRIES = 64

    def __init__(self, shardings: Sequence[Sharding], results: Sequence[TensorType]):
        self._shardings = list(shardings)
        self._results = list(results)
        self._found: dict[tuple[Sharding, ...], list[Sharding]] = {}

    def __call__(self, args: Sequence[Any]) -> list[Sharding]:
        key = tuple(a.sharding for a in args)
        found = self._found.get(key)
        if found is None:
            if len(self._found) >= self.ENTRIES:
                self._found.clear()
            found = self._found[key] = self._work_out(key)
        return found

    def _work_out(self, argument_shardings: tuple[Sharding, ...]) -> list[Sharding]:
        meshes = list(dict.fromkeys(s.mesh for s in argument_shardings
                                    if isinstance(s, NamedSharding)))
        out = []
        for sharding, result in zip(self._shardings, self._results):
            named = None
            for mesh in meshes:
                named = named_sharding_like(sharding, mesh, result.shape)
                if named is not None:
                    break
            out.append(sharding if named is None else named)
        return out

