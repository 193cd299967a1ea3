"""The documents hang together (issue 24): every relative link in README.md and docs/*.md
reaches an existing file (and heading, where it names one), and the README links every page
under docs/."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _links(text: str) -> list[str]:
    """The targets of the Markdown links and images of a page."""
    return re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _prose(text))


def _slugs(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated anchor numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M),
                              flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _relative(page: Path) -> list[str]:
    return [t for t in _links(page.read_text()) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_there_are_pages_and_links():
    """A regex that stopped finding links would pass every page; the README links several."""
    assert len(DOCS) >= 6, DOCS
    assert len(_relative(README)) >= len(DOCS), _relative(README)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_resolve(page):
    broken = []
    for target in _relative(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _slugs(dest.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_links_every_docs_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _relative(README)}
    missing = [p.relative_to(ROOT).as_posix() for p in DOCS if p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


def test_without_ms_swift_the_error_gives_the_route_the_docs_give(monkeypatch):
    """A plain `pip install ms-swift` pulls its own dependencies (TRL 1.x breaks its trainers, and
    they still miss some): the error names the route of docs/integrations.md's ms-swift section."""
    from importlib import metadata

    from impl.integrations import _common, swift

    real = metadata.version

    def version(dist):
        if dist == "ms-swift":
            raise metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(_common.metadata, "version", version)
    with pytest.raises(ImportError, match=r"needs ms-swift: in an environment without TRL 1\.x, the \[swift\] extra "
                                          r".* then pip install --no-deps 'ms-swift>=4\.6\.0,<4\.7\.0' "
                                          r"\(docs/integrations\.md#ms-swift"):
        swift.check_swift_version()
    assert "\n## ms-swift\n" in (ROOT / "docs" / "integrations.md").read_text()
