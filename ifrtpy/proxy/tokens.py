"""The ``!stablehlo.token`` parameters and results of a program's ``main``, served as jax's
PjRt client serves them.

jax compiles a program taking or returning tokens for ``jax.lax.create_token()``, a
``jit`` that returns or captures a token, and ordered effects. Its client counts every
parameter and result of ``main``: it passes a ``bool[0]`` array where ``main`` takes a
token and gets a token-typed array (dtype TOKEN, shape ``[]``) where it returns one, which
it only waits on, passes back as a ``bool[0]`` or drops. ifrtpy's executables take and
return arrays only, and order a program's effects themselves (the PjRt backend threads its
tokens from one run to the next). :class:`Signature` maps the client's positions to the
executable's; a returned token is a :class:`Token` of the session, ready when its run is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from ifrtpy.device import DeviceList
from ifrtpy.dtypes import DType
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.future import Future
from ifrtpy.program import HloProgram
from ifrtpy.shape import Shape
from ifrtpy.sharding import ConcreteEvenSharding, Sharding, SingleDeviceSharding

__all__ = ["Token", "Signature"]


class Token:
    """A token a program returned, held for the client under a result handle: no data; it
    is ready once the run that returned it completes, and can be deleted. Reads, copies and
    other array requests refuse it (:meth:`Session.array`)."""

    dtype = DType(DType.Kind.TOKEN)
    shape = Shape(())

    def __init__(self, devices: DeviceList, ready: Future):
        self.sharding: Sharding = (SingleDeviceSharding(devices[0]) if len(devices) == 1 else
                                   ConcreteEvenSharding(devices, self.shape, self.shape,
                                                        is_fully_replicated=True))
        self._ready = ready
        self._deleted = False

    def ready_future(self) -> Future:
        return self._ready

    def delete(self) -> Future:
        self._deleted = True
        return Future.ready()

    def is_deleted(self) -> bool:
        return self._deleted

    def __repr__(self) -> str:
        return f"<Token on {self.sharding}>"


@dataclasses.dataclass(frozen=True)
class Signature:
    """Where ``main``'s tokens are among its ``num_parameters`` parameters and
    ``num_results`` results (positions as the client counts them)."""

    num_parameters: int
    token_parameters: frozenset[int]
    num_results: int
    token_results: frozenset[int]

    @classmethod
    def of(cls, program: HloProgram) -> Signature:
        return cls(len(program.parameters) + len(program.token_parameters),
                   frozenset(program.token_parameters),
                   len(program.results) + len(program.token_results),
                   frozenset(program.token_results))

    def _arrays(self, count: int, tokens: frozenset[int]) -> list[int]:
        return [i for i in range(count) if i not in tokens]

    def array_index(self, parameter: int) -> int | None:
        """The executable's index of ``main``'s parameter ``parameter``; None for a token
        or a position ``main`` does not have."""
        arrays = self._arrays(self.num_parameters, self.token_parameters)
        return arrays.index(parameter) if parameter in arrays else None

    def main_parameters(self, indices: Any) -> list[int]:
        """``main``'s positions of the executable's parameters ``indices``."""
        arrays = self._arrays(self.num_parameters, self.token_parameters)
        return sorted(arrays[i] for i in indices)

    def arguments(self, values: Sequence[Any]) -> list[Any]:
        """The executable's arguments among the client's (one per parameter of ``main``):
        those at token parameters are dropped; a :class:`Token` elsewhere is refused."""
        if len(values) != self.num_parameters:
            raise InvalidArgumentError(
                f"Execute: the program's main takes {self.num_parameters} arguments, the "
                f"request names {len(values)}")
        arguments = []
        for i, value in enumerate(values):
            if i in self.token_parameters:
                continue
            if isinstance(value, Token):
                raise InvalidArgumentError(
                    f"Execute: argument {i} is a token, where the program's main takes an array")
            arguments.append(value)
        return arguments

    def parameters(self, arrays: Sequence[Any], token: Callable[[], Any]) -> list[Any]:
        """One item per parameter of ``main``: ``arrays`` in order, ``token()`` at tokens."""
        return _interleave(arrays, self.token_parameters, self.num_parameters, token)

    def results(self, arrays: Sequence[Any], token: Callable[[], Any]) -> list[Any]:
        """One item per result of ``main``: ``arrays`` in order, ``token()`` at tokens."""
        return _interleave(arrays, self.token_results, self.num_results, token)


def _interleave(arrays: Sequence[Any], tokens: frozenset[int], count: int,
                token: Callable[[], Any]) -> list[Any]:
    items = iter(arrays)
    return [token() if i in tokens else next(items) for i in range(count)]
