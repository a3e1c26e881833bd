"""Build StableHLO programs op by op in Python, as with XLA's XlaBuilder.

::

    from ifrtpy.builder import Builder
    b = Builder("axpy")
    x = b.parameter((4,), "f32")
    y = b.parameter((4,), "f32")
    program = b.build(2.0 * x + y)          # an ifrtpy.HloProgram

Values (:class:`Value`) carry a shape and a dtype; every op infers its result type when
called and raises :class:`~ifrtpy.errors.InvalidArgumentError`, naming the op and its
operand types, on a mismatch. StableHLO does not broadcast implicitly: elementwise ops need
equal shapes (``broadcast_to``/``broadcast_in_dim`` broadcast explicitly); only Python
scalars are turned into constants of the other operand's dtype and shape. Each op carries
its caller's file and line as an MLIR location. See docs/builder.md.
"""

from ifrtpy.builder._collectives import CollectiveOpsMixin
from ifrtpy.builder._core import BuilderCore, OpMetadata, shape_from_pyval, source_metadata
from ifrtpy.builder._custom_calls import CustomCallsMixin
from ifrtpy.builder._infer import approx_top_k_output_size as approx_top_k_reduction_output_size
from ifrtpy.builder._math import MathOpsMixin
from ifrtpy.builder._ops import (
    ConvDimensionNumbers, OpsMixin, ResultAccuracy, conv_dimension_numbers,
)
from ifrtpy.builder._regions import REDUCTIONS, RegionOpsMixin
from ifrtpy.builder._shardings import hlo_sharding_string
from ifrtpy.builder._value import Value

__all__ = ["Builder", "Value", "ConvDimensionNumbers", "conv_dimension_numbers",
           "hlo_sharding_string", "REDUCTIONS", "ResultAccuracy", "OpMetadata", "source_metadata",
           "shape_from_pyval", "approx_top_k_reduction_output_size"]


class Builder(CustomCallsMixin, CollectiveOpsMixin, MathOpsMixin, RegionOpsMixin, OpsMixin,
              BuilderCore):
    """A program under construction: ``parameter``, ``constant``, the op methods, then
    ``build(*results)``.

    ``name`` names the module; ``devices`` (optional) is the device list the program will
    be compiled for, in which sharding annotations' devices are looked up (by default a
    sharding's own device order is the program's).
    """
