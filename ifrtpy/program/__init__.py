"""Programs a compiler takes.

* :mod:`.hlo`: :class:`HloProgram` (a StableHLO module and its signature) and
  :func:`from_tensorflow`;
* :mod:`.inputs`: every front end an HloProgram is made from, turned into StableHLO text
  (untrusted bytes are read in a child process);
* :mod:`.mlir`: jaxlib's MLIR context with the dialects of StableHLO programs, the element
  types by name, and the StableHLO version jaxlib writes (shared with the builder and the
  reference backend).
"""

from ifrtpy.program.hlo import HloProgram as HloProgram
from ifrtpy.program.hlo import Program as Program
from ifrtpy.program.hlo import TensorType as TensorType
from ifrtpy.program.hlo import from_tensorflow as from_tensorflow
from ifrtpy.program.mlir import stablehlo_version as stablehlo_version

__all__ = ["Program", "HloProgram", "TensorType", "stablehlo_version", "from_tensorflow"]
