"""Docs that run: every ```python block of README.md and docs/*.md, each file's blocks in
order in one fresh interpreter (see tests/helpers/doc_blocks.py for the convention)."""

import pathlib
import re

import pytest

import doc_blocks

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_python_blocks_run(path, tmp_path):
    result = doc_blocks.run(path, ROOT, tmp_path)
    if result.returncode != 0:
        pytest.fail(result.stderr[-6000:], pytrace=False)


def test_troubleshooting_shows_the_real_errors(tmp_path):
    """Each error line shown on the page (``...`` standing for any text) is what its block
    printed."""
    path = ROOT / "docs" / "troubleshooting.md"
    shown = [line for line in path.read_text().splitlines() if re.match(r"^\w+Error: ", line)]
    result = doc_blocks.run(path, ROOT, tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    printed = result.stdout.splitlines()
    assert len(shown) == len(printed) > 5
    for expected, line in zip(shown, printed):
        assert re.fullmatch(".*".join(map(re.escape, expected.split("..."))), line), (expected, line)


def test_every_page_and_every_python_fence_is_run():
    """Each Markdown page at the top of the checkout and in docs/ (at any depth) is in
    FILES, and each fence that opens Python code, as a reader sees one, is a block that
    doc_blocks runs (a fence written ``python3``, indented or with a title would not be)."""
    assert {*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md")} == set(FILES)
    for path in FILES:
        fences = re.findall(r"^[ \t]*```+[ \t]*py", path.read_text(), flags=re.M | re.I)
        assert len(fences) == len(doc_blocks.blocks(path)), path


def test_the_index_names_every_page_and_the_readme_names_the_index():
    """docs/index.md says which page to read for what: it links every page of docs/."""
    index = (ROOT / "docs" / "index.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert set(re.findall(r"\]\(([\w-]+\.md)(?:#[\w-]+)?\)", index)) == pages
    assert "](docs/index.md)" in (ROOT / "README.md").read_text()
    for page in ("quickstart.md", "troubleshooting.md"):
        assert "](index.md)" in (ROOT / "docs" / page).read_text(), page


def write(tmp_path, text):
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


def test_blocks_share_a_namespace_and_not_run_blocks_are_skipped(tmp_path):
    path = write(tmp_path, "\n".join([
        "# Page", "```python", "x = 2", "```", "",
        "<!-- not-run: needs a GPU -->", "```python", "raise SystemExit(3)", "```",
        "```bash", "false", "```",
        "```python", "assert x == 2", "print('ran', x)", "```", ""]))
    assert [(b.line, b.not_run) for b in doc_blocks.blocks(path)] == [
        (2, None), (7, "needs a GPU"), (13, None)]
    result = doc_blocks.run(path, tmp_path, tmp_path)
    assert (result.returncode, result.stdout) == (0, "ran 2\n"), result.stderr


def test_a_fence_of_any_language_closes_at_its_own_fence(tmp_path):
    path = write(tmp_path, "\n".join([
        "```c++", "int x;", "```", "", "```python", "y = 1", "```", ""]))
    assert [(b.line, b.code) for b in doc_blocks.blocks(path)] == [(5, "y = 1")]


def test_a_failing_block_is_reported_with_file_and_line(tmp_path):
    path = write(tmp_path, "\n".join([
        "text", "```python", "a = 1", "```", "more", "```python", "b = a + 1",
        "c = undefined_name", "```", "```python", "print('not reached')", "```", ""]))
    result = doc_blocks.run(path, tmp_path, tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert "page.md:6: the python block that starts here failed" in result.stderr
    assert 'File "page.md", line 8' in result.stderr       # the failing line itself
    assert "c = undefined_name" in result.stderr
    assert "NameError" in result.stderr


def test_files_run_in_separate_interpreters(tmp_path):
    first = write(tmp_path, "```python\nimport os\nos.environ['DOC_BLOCK_MARK'] = '1'\n```\n")
    assert doc_blocks.run(first, tmp_path, tmp_path).returncode == 0
    second = write(tmp_path, "```python\nimport os\nassert 'DOC_BLOCK_MARK' not in os.environ\n```\n")
    assert doc_blocks.run(second, tmp_path, tmp_path).returncode == 0


@pytest.mark.parametrize("text, message", [
    ("<!-- not-run: -->\n```python\nx = 1\n```\n", "needs its reason"),
    ("<!-- not-run: GPU -->\n\n```python\nx = 1\n```\n", "just before a ```python fence"),
    ("<!-- not-run: GPU -->\n```bash\nls\n```\n", "just before a ```python fence"),
    ("```python\nx = 1\n", "not closed"),
])
def test_markup_mistakes_are_refused(tmp_path, text, message):
    with pytest.raises(doc_blocks.MarkupError, match=message):
        doc_blocks.blocks(write(tmp_path, text))
