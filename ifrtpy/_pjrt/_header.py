"""Where the PJRT C API header is found, for the build and for benchmark extensions.

Kept free of imports from ifrtpy so that setup.py can load it by path before the
package is built.
"""

import importlib.util
import os


def pjrt_include_dir() -> str:
    """The directory holding ``pjrt_c_api.h``: ``$IFRTPY_PJRT_INCLUDE_DIR``, else the
    ``include`` folder of the installed ``xla-cpu-pjrt`` package."""
    env = os.environ.get("IFRTPY_PJRT_INCLUDE_DIR")
    candidates = [env] if env else []
    try:
        spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    except ModuleNotFoundError:  # no xla_plugins package at all
        spec = None
    if spec is not None and spec.submodule_search_locations:
        candidates += [os.path.join(p, "include") for p in spec.submodule_search_locations]
    for directory in candidates:
        if os.path.isfile(os.path.join(directory, "pjrt_c_api.h")):
            return directory
    raise FileNotFoundError(
        "pjrt_c_api.h not found: install xla-cpu-pjrt, or set IFRTPY_PJRT_INCLUDE_DIR "
        "to a directory holding the header"
    )
