"""What the README and every ``docs/*.md`` page show is checked against the repository:

- a code block marked ``<!-- from: <file> -->`` is the code: each run of lines between elisions (a
  line ``    ...`` standing for a class body left out) appears, contiguous and exactly as formatted,
  in that file (so a refactor that changes the code fails here until the doc follows; ``ruff
  format`` leaves such blocks as they are);
- every other ``python`` block compiles, every ``yaml`` block parses;
- in ``bash`` blocks, every repository path (``configs/x.yaml``, ``benchmarks/x.py``) exists and
  every ``make <target>`` is a Makefile target;
- every repository path written in backticks in the prose (``configs/...``, ``comlrl_lightning/...``)
  exists;
- every relative link reaches a file and, with ``#anchor``, a heading of that file (GitHub's anchors).

The README's Python example also runs (``test_readme_example.py``), as does docs/cooperation.md's
(``test_cooperation_docs.py``).
"""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"<!-- from: (\S+) -->\n```python\n(.*?)```", re.S)
FENCE = re.compile(r"^ *```(\w*)\n(.*?)^ *```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"(?:configs|benchmarks|tests|comlrl_lightning|callbacks|datamodules|docs)/[\w./-]*\w")
MAKE = re.compile(r"\bmake ([\w-]+)")


ELISION = "    ..."


def quoted_blocks(text: str) -> list[tuple[str, list[str]]]:
    """``(file, run of lines)`` for every run between elisions of every marked block (blank lines
    around an elision dropped)."""
    out = []
    for path, code in BLOCK.findall(text):
        for run in "\n".join(code.splitlines()).split(f"\n{ELISION}\n"):
            out.append((path, run.strip("\n").splitlines()))
    return out


def appears_in(lines: list[str], source: list[str]) -> bool:
    return any(source[i : i + len(lines)] == lines for i in range(len(source) - len(lines) + 1))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than ``-`` and ``_`` dropped,
    spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (a ``#`` comment in a bash block is no heading)."""
    return FENCE.sub("", text)


def anchors(text: str) -> set[str]:
    return {anchor(line.lstrip("#")) for line in prose(text).splitlines() if re.match(r"#{1,6} ", line)}


def make_targets(root: Path = ROOT) -> set[str]:
    return set(re.findall(r"^([\w-]+):", (root / "Makefile").read_text(), re.M))


def problems(page: Path, text: str, root: Path = ROOT) -> list[str]:
    """Everything ``text`` (the contents of ``page``) shows that the repository under ``root``
    contradicts, one line each (empty when the page is right)."""
    out = []
    for path, lines in quoted_blocks(text):
        source = root / path
        if not source.exists() or not appears_in(lines, source.read_text().splitlines()):
            out.append(f"quotes code that is no longer in {path}: {lines[0]!r}...")
    quoted = {code for _, code in BLOCK.findall(text)}
    files, makes = [], re.findall(r"`make ([\w-]+)", prose(text))
    for lang, code in FENCE.findall(text):
        if lang == "python" and code not in quoted:
            try:
                compile(code, str(page), "exec")
            except SyntaxError as e:
                out.append(f"python block does not compile: {e}")
        elif lang == "yaml":
            try:
                yaml.safe_load(code)
            except yaml.YAMLError as e:
                out.append(f"yaml block does not parse: {e}")
        elif lang == "bash":
            files += REPO_PATH.findall(code)
            makes += MAKE.findall(code)
    files += [path for path in re.findall(r"`([^`\s]+)`", prose(text)) if REPO_PATH.fullmatch(path)]
    out += [f"names a missing file {path}" for path in sorted(set(files)) if not (root / path).exists()]
    out += [f"runs `make {t}`: no such target" for t in sorted(set(makes) - make_targets(root))]
    for target in LINK.findall(prose(text)):
        if re.match(r"\w+:", target):  # https:, mailto:
            continue
        file, _, name = target.partition("#")
        dest = (page.parent / file).resolve()
        if file and not dest.exists():
            out.append(f"links to a missing file {target}")
        elif name and (not file or dest.suffix == ".md"):
            if name not in anchors(dest.read_text() if file else text):
                out.append(f"links to a missing heading {target}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_matches_the_repository(page):
    assert problems(page, page.read_text()) == []


def test_architecture_code_blocks_are_quoted_from_the_code():
    blocks = quoted_blocks((ROOT / "docs/architecture.md").read_text())
    assert (
        len(blocks) >= 5
    )  # the corridor, the shared rollout (each with its class line), the Actors protocol


def test_a_changed_line_is_caught():
    source = ["def f():", "    return 1", ""]
    assert appears_in(["def f():", "    return 1"], source)
    assert not appears_in(["def f():", "    return 2"], source)


def test_anchors_follow_github():
    assert anchor("The GPU check: `make gpu-check`") == "the-gpu-check-make-gpu-check"
    assert anchor("The corridor: `MAGRPO.training_step`") == "the-corridor-magrpotraining_step"


BROKEN = {
    "from": "<!-- from: src.py -->\n```python\ndef f():\n    return 2\n```\n",
    "python": "```python\ndef f(:\n```\n",
    "yaml": "```yaml\nmodel: [unclosed\n```\n",
    "bash file": "```bash\ncomlrl-lightning fit --config configs/gone.yaml\n```\n",
    "make": "```bash\nmake nosuchtarget\n```\n",
    "prose path": "See `configs/gone.yaml`.\n",
    "prose make": "Run `make nosuchtarget`.\n",
    "link": "See [gone](gone.md).\n",
    "anchor": "See [here](other.md#no-such-heading).\n",
}


@pytest.mark.parametrize("kind", BROKEN)
def test_a_broken_block_or_link_is_reported(kind, tmp_path):
    (tmp_path / "Makefile").write_text("run: setup\n\techo\n")
    (tmp_path / "src.py").write_text("def f():\n    return 1\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "ok.yaml").write_text("model: {}\n")
    (tmp_path / "other.md").write_text("# Other\n\n## A heading\n")
    good = (
        "<!-- from: src.py -->\n```python\ndef f():\n    return 1\n```\n```python\nx = 1\n```\n"
        "```yaml\nmodel: {a: 1}\n```\n```bash\nmake run  # --config configs/ok.yaml\n```\n"
        "See `configs/ok.yaml`, [other](other.md#a-heading) and [top](#page).\n# Page\n"
    )
    page = tmp_path / "page.md"
    assert problems(page, good, tmp_path) == []
    assert len(problems(page, good + BROKEN[kind], tmp_path)) == 1
