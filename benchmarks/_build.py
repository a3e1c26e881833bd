"""Builds benchmarks/_floor.pyx into a temporary folder and imports it."""

import importlib
import os
import sys
import tempfile

import numpy
from Cython.Build import cythonize
from setuptools import Distribution, Extension

import ifrtpy
from ifrtpy._pjrt._header import pjrt_include_dir


def load_floor():
    here = os.path.dirname(os.path.abspath(__file__))
    package_root = os.path.dirname(os.path.dirname(ifrtpy.__file__))
    build = tempfile.mkdtemp(prefix="ifrtpy-floor-")
    extension = Extension(
        "_floor", [os.path.join(here, "_floor.pyx")],
        include_dirs=[pjrt_include_dir(), numpy.get_include()], extra_compile_args=["-O2"],
    )
    dist = Distribution({
        "ext_modules": cythonize([extension], include_path=[package_root], quiet=True,
                                 build_dir=build),
        "script_args": ["build_ext", "--build-lib", build, "--build-temp", build, "-q"],
    })
    dist.parse_command_line()
    dist.run_commands()
    sys.path.insert(0, build)
    return importlib.import_module("_floor")
