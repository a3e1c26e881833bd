"""Process-wide settings, read when they are used (set them at any time).

``compilation_cache_dir``: the persistent compilation cache's directory (str or None).
None leaves the choice to the environment variable ``IFRTPY_COMPILATION_CACHE_DIR``; with
neither, the persistent cache is off (see :mod:`ifrtpy.compilation_cache`).

``compilation_cache_max_bytes``: the cache's size cap; the least recently used entries
go first when it is exceeded.
"""

from __future__ import annotations

compilation_cache_dir: str | None = None
compilation_cache_max_bytes: int = 1 << 30
