"""The README, the repository's front door: it shows the architecture picture, its "reuse a
core" example runs, and every link in it and in the docs leads somewhere (a file of the
repository, and a heading of it where it names one)."""

import contextlib
import io
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in path.read_text().splitlines()
            if re.match(r"#{1,6} ", line)}


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        name, _, anchor = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        if not path.exists() or (anchor and path.suffix == ".md"
                                 and anchor not in _anchors(path)):
            broken.append(target)
    return broken


def test_readme_shows_the_architecture_picture():
    assert "](docs/architecture.svg)" in (ROOT / "README.md").read_text()


def test_readme_links_resolve():
    assert broken_links(ROOT / "README.md") == []


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A title: `x.py`\n\n## Two\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](a.md#a-title-xpy) [ok](a.md#two) [ok](#here) [url](https://x.org)\n"
                   "# Here\n[gone](b.md) [no heading](a.md#three)\n")
    assert broken_links(doc) == ["b.md", "a.md#three"]


def markdown_files() -> list[Path]:
    """Every Markdown file git tracks (README, docs, block docs)."""
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [ROOT / f for f in out]


def test_every_doc_link_resolves():
    broken = {str(doc.relative_to(ROOT)): b for doc in markdown_files()
              if (b := broken_links(doc))}
    assert not broken, f"broken links: {broken}"


def _section_code(text: str, heading: str) -> str:
    """The first ```python block after ``heading``."""
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_reuse_a_core_example_runs():
    """The example a newcomer copies works as written: it elaborates the two cores wired
    together and prints the Verilog of the component that holds them."""
    code = _section_code((ROOT / "README.md").read_text(), "## Reuse a core")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md (Reuse a core)", "exec"), {"__name__": "readme"})
    verilog = out.getvalue()
    assert "module prefix_lookup(" in verilog and "tokens__payload" in verilog \
        and "answers__valid" in verilog
