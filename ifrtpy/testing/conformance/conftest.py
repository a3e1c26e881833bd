"""Loads the conformance plugin when the suite is collected by path from a checkout
(``pytest ifrtpy/testing/conformance --ifrtpy-backend=reference``). With ``--pyargs``,
load it with ``-p ifrtpy.testing.conformance.plugin`` instead: pytest reads this file
only after it has parsed the command line."""

pytest_plugins = ["ifrtpy.testing.conformance.plugin"]
