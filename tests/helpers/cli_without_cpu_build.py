"""``python tests/helpers/cli_without_cpu_build.py ARGS...``: ``python -m ifrtpy ARGS...``
as on a machine without any XLA CPU build (package lookups find none of them); the
environment names the other plugins (``TPU_LIBRARY_PATH``, ``PJRT_NAMES_AND_LIBRARY_PATHS``)."""

import sys

from ifrtpy.__main__ import main
from ifrtpy.plugins import builds, discovery

from plugin_env import without_cpu_builds

if __name__ == "__main__":
    builds.package_dirs = discovery.package_dirs = without_cpu_builds(builds.package_dirs)
    assert builds.installed_builds() == []
    sys.exit(main(sys.argv[1:]))
