"""ifrtpy: a Python runtime layer for XLA devices, mirroring XLA's IFRT interfaces."""

from ifrtpy import errors as errors
from ifrtpy.dtypes import DType as DType

__version__ = "0.1.0"
