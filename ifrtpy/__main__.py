"""``python -m ifrtpy``: the command line (:mod:`ifrtpy.cli`). ``python -m ifrtpy serve``
first sets glibc's allocator for large transfers (``ifrtpy_jax_plugin.tune_allocator``,
docs/proxy.md), before its backend and server start their threads."""

import sys

if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    import ifrtpy_jax_plugin

    ifrtpy_jax_plugin.tune_allocator()

from ifrtpy.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
