"""PJRT plugins: finding them by name, and their typed create options.

* :mod:`.discovery`: :func:`find_plugin` and :func:`available_plugins` (jax's
  conventions: ``PJRT_NAMES_AND_LIBRARY_PATHS``, the ``jax_plugins`` and ``xla_plugins``
  packages, libtpu by ``TPU_LIBRARY_PATH`` or its package, entry points), and the CUDA
  libraries of ``nvidia-*`` wheels;
* :mod:`.builds`: the XLA CPU plugin builds ifrtpy knows, and which is the default
  (``"cpu"``);
* :mod:`.options`: the create options each known plugin reads, checked before it sees them;
* :mod:`.held_tpu`: a TPU another process holds: who holds it, and the error saying so.
"""

from ifrtpy.plugins.discovery import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from ifrtpy.plugins.discovery import ENV_VAR as ENV_VAR
from ifrtpy.plugins.discovery import SEARCH_ORDER as SEARCH_ORDER
from ifrtpy.plugins.discovery import TPU_ENV_VAR as TPU_ENV_VAR
from ifrtpy.plugins.discovery import PluginInfo as PluginInfo
from ifrtpy.plugins.discovery import available_plugins as available_plugins
from ifrtpy.plugins.discovery import find_plugin as find_plugin
from ifrtpy.plugins.discovery import plugin_not_found as plugin_not_found
from ifrtpy.plugins.discovery import plugins_report as plugins_report
from ifrtpy.plugins.discovery import preload_nvidia_libraries as preload_nvidia_libraries
from ifrtpy.plugins.options import MAX_CPU_DEVICE_COUNT as MAX_CPU_DEVICE_COUNT
from ifrtpy.plugins.options import OptionSpec as OptionSpec
from ifrtpy.plugins.options import check_options as check_options
from ifrtpy.plugins.options import known_options as known_options

__all__ = [
    "PluginInfo", "available_plugins", "find_plugin", "plugin_not_found", "plugins_report",
    "preload_nvidia_libraries", "ENV_VAR", "TPU_ENV_VAR", "ENTRY_POINT_GROUP", "SEARCH_ORDER",
    "OptionSpec", "MAX_CPU_DEVICE_COUNT", "known_options", "check_options",
]
