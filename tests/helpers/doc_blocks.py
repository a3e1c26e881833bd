"""The ```python blocks of a Markdown file, and running them in a fresh interpreter.

The convention (README.md and docs/*.md): every block fenced with ```python runs as-is;
the blocks of one file share one namespace, in order, like a notebook. A block that cannot
run has ``<!-- not-run: <reason> -->`` on the line just before its opening fence.

Run a file's blocks by hand with ``python tests/helpers/doc_blocks.py docs/quickstart.md``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
import sys

FENCE = re.compile(r"^```([^\s`]*)\s*$")  # any info string: c++ opens a fence too
NOT_RUN = re.compile(r"^<!--\s*not-run:(.*?)-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    line: int            # 1-based line of the opening fence
    code: str
    not_run: str | None  # the reason, for a block marked not runnable


class MarkupError(ValueError):
    """A fence left open, a not-run mark without a reason or not before a python block."""


def blocks(path: pathlib.Path) -> list[Block]:
    """The ```python blocks of ``path`` in order."""
    lines = path.read_text().split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        mark = NOT_RUN.match(lines[i])
        if mark:
            nxt = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            if not nxt or nxt.group(1) != "python":
                raise MarkupError(f"{path}:{i + 1}: a not-run mark must be on the line just "
                                  "before a ```python fence")
            if not mark.group(1).strip():
                raise MarkupError(f"{path}:{i + 1}: a not-run mark needs its reason: "
                                  "<!-- not-run: <reason> -->")
        if m:
            start = i
            end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
            if end is None:
                raise MarkupError(f"{path}:{start + 1}: the fence opened here is not closed")
            if m.group(1) == "python":
                before = NOT_RUN.match(lines[start - 1]) if start > 0 else None
                out.append(Block(start + 1, "\n".join(lines[start + 1:end]),
                                 before.group(1).strip() if before else None))
            i = end + 1
            continue
        i += 1
    return out


RUNNER = r"""
import json, linecache, sys, traceback
path, blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for line, code in blocks:
    # Padded so that tracebacks give the line numbers (and lines) of the Markdown file.
    source = "\n" * line + code + "\n"
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    try:
        exec(compile(source, path, "exec"), namespace)
    except BaseException:
        print(f"\n{path}:{line}: the python block that starts here failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def run(path: pathlib.Path, root: pathlib.Path, cwd: pathlib.Path, timeout: float = 600,
        ) -> subprocess.CompletedProcess[str]:
    """Run the runnable blocks of ``path`` in a fresh interpreter, working in ``cwd``.

    File names in tracebacks are relative to ``root``; on failure, stderr names the file
    and the line of the failing block's opening fence.
    """
    runnable = [(b.line, b.code) for b in blocks(path) if b.not_run is None]
    name = str(path.resolve().relative_to(root.resolve()))
    return subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps([name, runnable]),
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


if __name__ == "__main__":
    import tempfile

    for arg in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as cwd:
            result = run(pathlib.Path(arg), pathlib.Path(__file__).resolve().parents[2],
                         pathlib.Path(cwd))
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
            if result.returncode:
                sys.exit(result.returncode)
