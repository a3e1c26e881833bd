"""The old path of :mod:`ifrtpy.plugins.options`, kept for one release."""

import warnings

from ifrtpy.plugins.options import MAX_CPU_DEVICE_COUNT as MAX_CPU_DEVICE_COUNT
from ifrtpy.plugins.options import OptionSpec as OptionSpec
from ifrtpy.plugins.options import check_options as check_options
from ifrtpy.plugins.options import known_options as known_options

__all__ = ["OptionSpec", "MAX_CPU_DEVICE_COUNT", "known_options", "check_options"]

warnings.warn("ifrtpy.plugin_options is now ifrtpy.plugins (check_options, known_options, ...)",
              DeprecationWarning, stacklevel=2)
