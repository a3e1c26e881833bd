"""Remapping shards between arrays: IFRT's ``RemapPlan`` and a generic ``remap_arrays``.

A :class:`RemapPlan` regroups the shards of some input arrays into some output arrays
without moving data: every output shard is exactly one input shard, already on the
output shard's device. It mirrors IFRT's ``remap_plan.h`` in its ``mappings`` form: each
:class:`Mapping` sends the shards of one input array picked by a list of
:class:`Interval` (Python slice semantics over shard indices) to the shards of one output
array picked by a list of the same length.

Shard ``k`` of an array is the shard on ``sharding.devices[k]`` (all devices, addressable
or not, as in IFRT's ``RemapPlan::Validate``). :meth:`RemapPlan.shard_moves` gives the
plan mechanically: for each output shard, the ``(input array, input shard)`` it takes.

:func:`remap_arrays` executes a plan on any backend that implements
``Array.disassemble_into_single_device_arrays`` and
``Client.assemble_array_from_single_device_arrays``.

Every type here is an immutable value: hashable, comparable, picklable. Errors are
:class:`~ifrtpy.errors.InvalidArgumentError` with IFRT's messages.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

from ifrtpy.array import Array, ArrayCopySemantics, ArraySpec
from ifrtpy.errors import IfrtError, InvalidArgumentError
from ifrtpy.sharding import SingleDeviceShardSemantics

if TYPE_CHECKING:
    from ifrtpy.client import Client

__all__ = ["Interval", "Mapping", "RemapPlan", "remap_arrays"]

ALWAYS_COPY = ArrayCopySemantics.ALWAYS_COPY
REUSE_INPUT = ArrayCopySemantics.REUSE_INPUT
DONATE_INPUT = ArrayCopySemantics.DONATE_INPUT


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{what} must be an int, got {value!r}") from None


class Interval:
    """Shard indices ``range(start, end, step)``: Python slice semantics with ``step > 0``.

    ``Interval(0, 4, 2)`` picks shards 0 and 2. Whether ``start``/``end`` fit an array is
    checked by :meth:`RemapPlan.validate`; a non-positive ``step`` is refused here with
    IFRT's message. ``debug_string()`` gives IFRT's ``[start:end:step]``.
    """

    __slots__ = ("_start", "_end", "_step")

    def __init__(self, start: int, end: int, step: int = 1):
        self._start = _int(start, "Interval start")
        self._end = _int(end, "Interval end")
        self._step = _int(step, "Interval step")
        if self._step <= 0:
            raise InvalidArgumentError(f"step must be positive, but is {self._step}")

    @classmethod
    def from_slice(cls, s: slice) -> Interval:
        """The interval of a ``slice`` with a stop: ``slice(1, 4, 2)`` -> ``[1:4:2]``."""
        if s.stop is None:
            raise InvalidArgumentError(f"an Interval needs an end; got {s!r}")
        return cls(0 if s.start is None else s.start, s.stop, 1 if s.step is None else s.step)

    @property
    def start(self) -> int:
        return self._start

    @property
    def end(self) -> int:
        return self._end

    @property
    def step(self) -> int:
        return self._step

    def indices(self) -> range:
        """The shard indices picked, in order."""
        return range(self._start, self._end, self._step)

    def num_steps(self) -> int:
        """How many shard indices the interval picks (0 when ``end <= start``)."""
        return len(self.indices())

    __len__ = num_steps

    def to_slice(self) -> slice:
        return slice(self._start, self._end, self._step)

    def debug_string(self) -> str:
        return f"[{self._start}:{self._end}:{self._step}]"

    __str__ = debug_string

    def _key(self) -> tuple[int, int, int]:
        return (self._start, self._end, self._step)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Interval):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((Interval, self._key()))

    def __repr__(self) -> str:
        return f"Interval({self._start}, {self._end}, {self._step})"

    def __reduce__(self):
        return (Interval, self._key())


IntervalLike = Union[Interval, slice, Sequence[int]]


def _as_interval(value: IntervalLike) -> Interval:
    if isinstance(value, Interval):
        return value
    if isinstance(value, slice):
        return Interval.from_slice(value)
    if isinstance(value, (tuple, list)) and len(value) in (2, 3):
        return Interval(*value)
    raise InvalidArgumentError(
        f"expected an Interval, a slice or a (start, end[, step]) tuple, got {value!r}")


def _as_intervals(values: Union[IntervalLike, Iterable[IntervalLike]], what: str
                  ) -> tuple[Interval, ...]:
    if isinstance(values, (Interval, slice)):
        return (_as_interval(values),)
    try:
        items = list(values)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"{what} must be a list of Intervals, got {values!r}") from None
    return tuple(map(_as_interval, items))


class Mapping:
    """Shards ``from_`` of input ``in_array`` go to shards ``to`` of output ``out_array``.

    ``from_`` and ``to`` are lists of :class:`Interval` (slices and ``(start, end[, step])``
    tuples are converted); interval ``s`` of ``from_`` pairs with interval ``s`` of ``to``,
    index by index. :meth:`RemapPlan.validate` checks that the lists have the same length
    and paired intervals the same number of steps (as IFRT does, with the mapping's index).
    """

    __slots__ = ("_in_array", "_out_array", "_from", "_to")

    def __init__(self, in_array: int, out_array: int,
                 from_: Iterable[IntervalLike], to: Iterable[IntervalLike]):
        self._in_array = _int(in_array, "Mapping in_array")
        self._out_array = _int(out_array, "Mapping out_array")
        self._from = _as_intervals(from_, "Mapping from_")
        self._to = _as_intervals(to, "Mapping to")

    @property
    def in_array(self) -> int:
        return self._in_array

    @property
    def out_array(self) -> int:
        return self._out_array

    @property
    def from_(self) -> tuple[Interval, ...]:
        return self._from

    @property
    def to(self) -> tuple[Interval, ...]:
        return self._to

    def num_shards(self) -> int:
        """Total number of input shard indices ``from_`` picks."""
        return sum(map(len, self._from))

    def debug_string(self) -> str:
        def fmt(intervals):
            return "[" + ",".join(i.debug_string() for i in intervals) + "]"
        return (f"Mapping(in_array={self._in_array},out_array={self._out_array},"
                f"from={fmt(self._from)},to={fmt(self._to)})")

    __str__ = debug_string

    def _key(self):
        return (self._in_array, self._out_array, self._from, self._to)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((Mapping, self._key()))

    def __repr__(self) -> str:
        return (f"Mapping({self._in_array}, {self._out_array}, from_={list(self._from)!r}, "
                f"to={list(self._to)!r})")

    def __reduce__(self):
        return (Mapping, self._key())


def _as_mapping(value: Any) -> Mapping:
    if isinstance(value, Mapping):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 4:
        return Mapping(*value)
    raise InvalidArgumentError(
        f"expected a Mapping or an (in_array, out_array, from_, to) tuple, got {value!r}")


def _check_range(num_shards: int, interval: Interval, where: str) -> None:
    """IFRT's CheckRange, plus: the last index stepped to must be a shard."""
    if interval.start < 0 or interval.start > num_shards - 1:
        raise InvalidArgumentError(
            f"{where}: start must be in [0, {num_shards - 1}], but is {interval.start}")
    if interval.step <= 0:
        raise InvalidArgumentError(f"{where}: step must be positive, but is {interval.step}")
    if interval.end < 0 or interval.end > num_shards + interval.step - 1:
        raise InvalidArgumentError(
            f"{where}: end must be in [0, {num_shards + interval.step - 1}] if step is "
            f"{interval.step}, but is {interval.end}")
    indices = interval.indices()
    if indices and indices[-1] >= num_shards:
        raise InvalidArgumentError(
            f"{where}: interval addresses shard {indices[-1]}, which is out of range "
            f"[0, {num_shards})")


class _ShardShapes:
    """The shard shapes of a spec: one fixed shape, or one per shard (IFRT's
    ShardShapeVector): ``sharding.shard_shape`` when it has one, else ``disassemble``."""

    __slots__ = ("fixed", "shapes")

    def __init__(self, spec: ArraySpec):
        self.shapes: Optional[list[Any]] = None
        try:
            self.fixed: Any = spec.sharding.shard_shape(spec.shape)
            return
        except IfrtError:
            self.fixed = None
        pieces = spec.sharding.disassemble(spec.shape, SingleDeviceShardSemantics.ALL_SHARDS)
        self.shapes = [shape for shape, _ in pieces]

    def __getitem__(self, shard: int) -> Any:
        return self.fixed if self.shapes is None else self.shapes[shard]


def _fmt(value: Any) -> str:
    debug = getattr(value, "debug_string", None)
    return debug() if callable(debug) else str(value)


def _as_semantics(semantics: Any) -> ArrayCopySemantics:
    try:
        return ArrayCopySemantics(semantics)
    except ValueError:
        raise InvalidArgumentError(f"Invalid ArrayCopySemantics: {semantics!r}") from None


class RemapPlan:
    """How to regroup the shards of ``input_specs`` arrays into ``output_specs`` arrays.

    Immutable value (IFRT ``RemapPlan``, ``mappings`` form): hashable, comparable,
    picklable. Construction only converts its arguments; :meth:`validate` checks the
    plan (and caches success), :meth:`shard_moves` gives the per-shard plan a backend
    executes, :meth:`check_array_copy_semantics` says which copy semantics it allows.
    """

    __slots__ = ("_input_specs", "_output_specs", "_mappings", "_hash", "_moves")

    def __init__(self, input_specs: Iterable[ArraySpec], output_specs: Iterable[ArraySpec],
                 mappings: Iterable[Union[Mapping, tuple]]):
        self._input_specs = tuple(input_specs)
        self._output_specs = tuple(output_specs)
        for what, specs in (("input_specs", self._input_specs),
                            ("output_specs", self._output_specs)):
            for i, spec in enumerate(specs):
                if not isinstance(spec, ArraySpec):
                    raise InvalidArgumentError(
                        f"{what}[{i}] must be an ArraySpec, got {type(spec).__name__}")
        self._mappings = tuple(map(_as_mapping, mappings))
        self._hash: Optional[int] = None
        # Per output array, the (in_array, in_shard) of each output shard; set by validate().
        self._moves: Optional[tuple[tuple[tuple[int, int], ...], ...]] = None

    @property
    def input_specs(self) -> tuple[ArraySpec, ...]:
        return self._input_specs

    @property
    def output_specs(self) -> tuple[ArraySpec, ...]:
        return self._output_specs

    @property
    def mappings(self) -> tuple[Mapping, ...]:
        return self._mappings

    # -- validation -------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise InvalidArgumentError unless the plan is well formed (slow; cached).

        Checks, with IFRT's messages: at least one input, output and mapping; shardings
        present; mapping array indices and interval ranges in bounds; paired intervals of
        equal length; every mapped input/output pair of the same dtype, layout, memory kind
        and shard shape; each input shard used at most once; each output shard assigned
        exactly once; and each output shard on the device of the input shard it takes.
        """
        if self._moves is None:
            self._moves = self._validate()

    def _validate(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        inputs, outputs = self._input_specs, self._output_specs
        num_inputs, num_outputs = len(inputs), len(outputs)
        if num_inputs == 0:
            raise InvalidArgumentError("Must have at least one input")
        if num_outputs == 0:
            raise InvalidArgumentError("Must have at least one output")
        for i, spec in enumerate(inputs):
            if spec.sharding is None:
                raise InvalidArgumentError(f"Input array {i} has null sharding")
        for i, spec in enumerate(outputs):
            if spec.sharding is None:
                raise InvalidArgumentError(f"Output array {i} has null sharding")
        if not self._mappings:
            raise InvalidArgumentError("Must have at least one mapping")

        in_used = [[False] * len(spec.sharding.devices) for spec in inputs]
        out_from: list[list[Optional[tuple[int, int]]]] = [
            [None] * len(spec.sharding.devices) for spec in outputs]
        in_shapes: dict[int, _ShardShapes] = {}
        out_shapes: dict[int, _ShardShapes] = {}

        for m, mapping in enumerate(self._mappings):
            a, b = mapping.in_array, mapping.out_array
            if not 0 <= a < num_inputs:
                raise InvalidArgumentError(
                    f"mappings[{m}].in_array must be in [0, {num_inputs - 1}], but is {a} "
                    f"(Input array index {a} is out of range)")
            if not 0 <= b < num_outputs:
                raise InvalidArgumentError(
                    f"mappings[{m}].out_array must be in [0, {num_outputs - 1}], but is {b} "
                    f"(Output array index {b} is out of range)")
            if len(mapping.from_) != len(mapping.to):
                raise InvalidArgumentError(
                    f"mappings[{m}].from and mappings[{m}].to must have the same number of "
                    f"intervals, but has {len(mapping.from_)} and {len(mapping.to)} intervals")
            in_spec, out_spec = inputs[a], outputs[b]
            if in_spec.dtype != out_spec.dtype:
                raise InvalidArgumentError(
                    f"Input and output must have the same dtype: {in_spec.dtype} (input {a}) "
                    f"vs. {out_spec.dtype} (output {b})")
            if in_spec.layout != out_spec.layout:
                raise InvalidArgumentError(
                    f"Input and output must have the same layout: {in_spec.layout} (input {a}) "
                    f"vs. {out_spec.layout} (output {b})")
            in_kind, out_kind = in_spec.sharding.memory_kind, out_spec.sharding.memory_kind
            if in_kind != out_kind:
                raise InvalidArgumentError(
                    f"Input and output must have the same memory kind: {in_kind} (input {a}) "
                    f"vs. {out_kind} (output {b})")
            if a not in in_shapes:
                in_shapes[a] = _ShardShapes(in_spec)
            if b not in out_shapes:
                out_shapes[b] = _ShardShapes(out_spec)
            in_sh, out_sh = in_shapes[a], out_shapes[b]
            per_shard = in_sh.fixed is None or out_sh.fixed is None
            if not per_shard and in_sh.fixed != out_sh.fixed:
                raise InvalidArgumentError(
                    f"Input and output must have the same shard shape: {_fmt(in_sh.fixed)} "
                    f"(input {a}) vs. {_fmt(out_sh.fixed)} (output {b})")

            used, assigned = in_used[a], out_from[b]
            for s, (src, dst) in enumerate(zip(mapping.from_, mapping.to)):
                _check_range(len(used), src, f"mappings[{m}].from[{s}]")
                _check_range(len(assigned), dst, f"mappings[{m}].to[{s}]")
                if len(src) != len(dst):
                    raise InvalidArgumentError(
                        f"mappings[{m}].from[{s}] and mappings[{m}].to[{s}] must have the same "
                        f"number of steps, but were {len(src)} and {len(dst)} "
                        f"({src.debug_string()} vs. {dst.debug_string()})")
                for in_shard, out_shard in zip(src.indices(), dst.indices()):
                    if used[in_shard]:
                        raise InvalidArgumentError(
                            f"Input array {a} shard {in_shard} is already used")
                    used[in_shard] = True
                    if assigned[out_shard] is not None:
                        raise InvalidArgumentError(
                            f"Output array {b} shard {out_shard} is already assigned")
                    assigned[out_shard] = (a, in_shard)
                    if per_shard and in_sh[in_shard] != out_sh[out_shard]:
                        raise InvalidArgumentError(
                            f"Input and output must have the same shard shape: output array "
                            f"{b} shard {out_shard} is {_fmt(out_sh[out_shard])}, but input "
                            f"array {a} shard {in_shard} is {_fmt(in_sh[in_shard])}")

        for b, assigned in enumerate(out_from):
            for out_shard, source in enumerate(assigned):
                if source is None:
                    raise InvalidArgumentError(f"Output array {b} shard {out_shard} is unassigned")
            expected = outputs[b].sharding.devices
            got = [inputs[a].sharding.devices[k] for a, k in assigned]  # type: ignore[misc]
            if tuple(got) != expected.devices:
                j = next(j for j, d in enumerate(got) if d is not expected[j])
                a, k = assigned[j]  # type: ignore[misc]
                raise InvalidArgumentError(
                    f"Output array {b} devices and sharding devices do not match: Expected "
                    f"{expected.to_string()}, but got [{','.join(d.to_string() for d in got)}] "
                    f"(remap never moves data: output shard {j} is on "
                    f"{expected[j].to_string()}, but input array {a} shard {k} is on "
                    f"{got[j].to_string()})")
        return tuple(tuple(assigned) for assigned in out_from)  # type: ignore[arg-type]

    def shard_moves(self) -> list[list[tuple[int, int]]]:
        """For each output array, the ``(in_array, in_shard)`` of each output shard.

        ``shard_moves()[b][j] == (a, k)`` means shard ``j`` of output ``b`` is shard ``k``
        of input ``a`` (the same device: remap never moves data). Shard indices are
        positions in the sharding's device list. Validates the plan first.
        """
        self.validate()
        return [list(moves) for moves in self._moves]  # type: ignore[union-attr]

    def one_input_per_output(self) -> bool:
        """Whether every output array draws all its shards from a single input array."""
        source: dict[int, int] = {}
        for mapping in self._mappings:
            if source.setdefault(mapping.out_array, mapping.in_array) != mapping.in_array:
                return False
        return True

    def check_array_copy_semantics(self, semantics: ArrayCopySemantics) -> None:
        """Raise InvalidArgumentError unless the plan can run with ``semantics``.

        DONATE_INPUT always can. REUSE_INPUT only when each output draws on one input
        (IFRT's rule). ALWAYS_COPY never: a remap moves no data, so it cannot copy.
        """
        semantics = _as_semantics(semantics)
        if semantics is ALWAYS_COPY:
            raise InvalidArgumentError(
                "RemapArrays does not support ArrayCopySemantics.ALWAYS_COPY (a remap moves "
                "no data); use REUSE_INPUT or DONATE_INPUT")
        if semantics is REUSE_INPUT and not self.one_input_per_output():
            raise InvalidArgumentError(
                "kDonateInput is required if multiple inputs are mapped to one output "
                "(use ArrayCopySemantics.DONATE_INPUT)")

    # -- value protocol ---------------------------------------------------------------------

    def debug_string(self) -> str:
        def specs(values):
            return "[" + ",".join(repr(v) for v in values) + "]"
        return (f"RemapPlan(input_specs={specs(self._input_specs)},output_specs="
                f"{specs(self._output_specs)},mappings=["
                + ",".join(m.debug_string() for m in self._mappings) + "])")

    def _key(self):
        return (self._input_specs, self._output_specs, self._mappings)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, RemapPlan):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((RemapPlan, self._key()))
        return self._hash

    def __repr__(self) -> str:
        return (f"RemapPlan(input_specs={list(self._input_specs)!r}, "
                f"output_specs={list(self._output_specs)!r}, mappings={list(self._mappings)!r})")

    def __reduce__(self):
        return (RemapPlan, self._key())


def remap_arrays(client: Client, plan: RemapPlan, arrays: Sequence[Array],
                 semantics: ArrayCopySemantics) -> list[Array]:
    """Run ``plan`` on ``arrays`` with any backend's disassemble/assemble.

    Checks the copy semantics and that ``arrays`` match ``plan.input_specs`` (count,
    dtype, shape, devices and memory kind; IFRT's messages) and validates the plan,
    all before touching an array. Then disassembles every input into its addressable
    single-device arrays (with ``semantics``: DONATE_INPUT deletes the inputs), picks the
    pieces by :meth:`RemapPlan.shard_moves` and assembles each output with
    ``client.assemble_array_from_single_device_arrays`` (same ``semantics``). Shards on
    non-addressable devices are skipped: each output shard lives where its input shard
    does. With DONATE_INPUT, input shards no output takes are deleted.
    """
    if not isinstance(plan, RemapPlan):
        raise InvalidArgumentError(f"RemapArrays expects a RemapPlan, got {type(plan).__name__}")
    semantics = _as_semantics(semantics)
    plan.check_array_copy_semantics(semantics)
    arrays = list(arrays)
    specs = plan.input_specs
    if len(specs) != len(arrays):
        raise InvalidArgumentError(
            f"RemapArrays expects {len(specs)} input arrays, but got {len(arrays)}")
    for i, (spec, array) in enumerate(zip(specs, arrays)):
        if not isinstance(array, Array):
            raise InvalidArgumentError(
                f"RemapArrays expects input #{i} to be an Array, but got {type(array).__name__}")
        if array.is_deleted():
            raise InvalidArgumentError(f"RemapArrays expects input #{i} to be live, but it "
                                       f"is deleted: {array.debug_string()}")
        if spec.dtype != array.dtype:
            raise InvalidArgumentError(
                f"RemapArrays expects input #{i} to have dtype {spec.dtype}, but got "
                f"{array.dtype}")
        if tuple(spec.shape) != tuple(array.shape):
            raise InvalidArgumentError(
                f"RemapArrays expects input #{i} to have shape {_fmt(spec.shape)}, but got "
                f"{_fmt(array.shape)}")
        # As IFRT: devices and memory kind only, not the partitioning (callers may
        # reinterpret a sharding).
        want, have = spec.sharding, array.sharding
        if want is None or want.devices != have.devices or want.memory_kind != have.memory_kind:
            raise InvalidArgumentError(
                f"RemapArrays expects input #{i} to be on "
                f"{'<null>' if want is None else want.devices.to_string()} with "
                f"{'<null>' if want is None else want.memory_kind}, but is on "
                f"{have.devices.to_string()} with {have.memory_kind}")
    moves = plan.shard_moves()  # validates the plan

    addressable = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
    # Position of each shard among its array's addressable shards (None: not addressable).
    in_positions: list[list[Optional[int]]] = []
    for spec in specs:
        positions: list[Optional[int]] = []
        count = 0
        for is_addressable in spec.sharding.devices.addressable_mask():
            positions.append(count if is_addressable else None)
            count += is_addressable
        in_positions.append(positions)
    pieces = [array.disassemble_into_single_device_arrays(semantics, addressable)
              for array in arrays]
    taken = [[False] * len(p) for p in pieces]

    outputs = []
    for spec, out_moves in zip(plan.output_specs, moves):
        mask = spec.sharding.devices.addressable_mask()
        shards = []
        for is_addressable, (a, k) in zip(mask, out_moves):
            if not is_addressable:
                continue
            pos = in_positions[a][k]
            assert pos is not None  # same device as the output shard, so addressable
            shards.append(pieces[a][pos])
            taken[a][pos] = True
        outputs.append(client.assemble_array_from_single_device_arrays(
            spec.shape, spec.sharding, shards, semantics, addressable, dtype=spec.dtype))
    if semantics is DONATE_INPUT:
        for array_pieces, array_taken in zip(pieces, taken):
            for piece, was_taken in zip(array_pieces, array_taken):
                if not was_taken:
                    piece.delete()
    return outputs
