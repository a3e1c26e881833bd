"""Fixtures for plugin discovery tests: an environment naming no plugin, and a machine
without any XLA CPU build (its package lookups find none). Import both names into a
test module to use them."""

import os

import pytest

from ifrtpy.plugins import builds
from ifrtpy.plugins import discovery as plugins

#: The CPU plugin's library (its real path), for fakes that link to it.
CPU_SO = os.path.realpath(builds.default_cpu_library())
#: The top-level packages holding the CPU builds (xla_plugins holds xla-cpu-pjrt's).
CPU_PACKAGES = {b.package.split(".")[0] for b in builds.CPU_BUILDS}


def without_cpu_builds(package_dirs):
    """``package_dirs`` (:func:`ifrtpy.plugins.builds.package_dirs`) finding none of the
    CPU builds' packages."""
    def hiding(package):
        return [] if package.split(".")[0] in CPU_PACKAGES else package_dirs(package)
    return hiding


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    monkeypatch.delenv(plugins.TPU_ENV_VAR, raising=False)
    return monkeypatch


@pytest.fixture
def no_cpu_build(clean_env):
    """As on a machine without any CPU build: package lookups find none of them."""
    package_dirs = without_cpu_builds(builds.package_dirs)
    clean_env.setattr(builds, "package_dirs", package_dirs)
    clean_env.setattr(plugins, "package_dirs", package_dirs)
    clean_env.setattr(plugins, "_last_search", None)  # the cache key does not see the patch
    assert builds.installed_builds() == []
    return clean_env
