"""docs/results.md against the results it cites (no models, no figures drawn).

1. The page is what `python benchmarks/report.py` writes from docs/results_template.md and benchmarks/results/: its
   tables, commands and commits come from the files, and a page edited by hand, or left behind by a changed file,
   fails.
2. Every figure the template's prose quotes by hand (a decimal such as 0.34, a count such as 20/48, a p-value such as
   3e-18) occurs in a file it cites: the results files and commits (`git log <hash>`) named in the same paragraph,
   table or list item, or where that names none, those named anywhere in its section (`## ...`), directives included.
   A decimal matches a number in the file that rounds to it; a count a/b matches "a/b" written there, or a rate
   equal to a/b at the file's precision (0.385 for 37/96).
"""
from __future__ import annotations

import re
import subprocess
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TEMPLATE = ROOT / "docs" / "results_template.md"
PAGE = ROOT / "docs" / "results.md"

DIRECTIVE = re.compile(r"^\{\{\s*\w+\s+([A-Za-z0-9_]+)")
FILE_REF = re.compile(r"\b([A-Za-z0-9_]+\.(?:md|json))\b")
COMMIT_REF = re.compile(r"git log ([0-9a-f]{7,40})\b")
# what the prose quotes: counts a/b, p-values and small figures in e-notation, decimals (not versions like 2.13.0,
# not parts of names like Qwen2.5)
COUNT = re.compile(r"(?<![\w./])(\d+)/(\d+)(?![\w/]|\.\d)")
SCI = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?e-\d+)(?![\w.])")
DECIMAL = re.compile(r"(?<![\w.])(\d+\.\d+)(?![\w]|\.\d)")
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def render() -> str:
    sys.path.insert(0, str(ROOT))
    from benchmarks.report import render_page

    return render_page(RESULTS, PAGE.parent, draw=False)


def test_the_page_is_what_the_generator_writes():
    assert PAGE.read_text() == render(), ("docs/results.md differs from what benchmarks/report.py makes of docs/"
                                          "results_template.md: edit the template, then run python benchmarks/report.py")


# -- figures quoted by hand -------------------------------------------------------------------------------------------


def prose(line: str) -> str:
    """A line without what is not quoted prose: code spans and link targets."""
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", " ", line))


def sections(text: str) -> list[tuple[str, list[list[str]]]]:
    """(heading, blocks) per `## ` section; a block is a paragraph, a table, a directive or a list item (raw lines)."""
    out: list[tuple[str, list[list[str]]]] = [("(top)", [])]
    block: list[str] = []

    def flush():
        if block:
            out[-1][1].append(list(block))
            block.clear()

    for line in text.splitlines():
        if line.startswith("## "):
            flush()
            out.append((line[3:].strip(), []))
        elif not line.strip() or line.startswith("- ") or DIRECTIVE.match(line.strip()):
            flush()
            if line.strip():
                block.append(line)
                if DIRECTIVE.match(line.strip()):
                    flush()
        else:
            block.append(line)
    flush()
    return out


def cited(lines: list[str]) -> set[str]:
    """The results files ('NAME.md', 'NAME.json') and commits ('git:HASH') a block names. A directive cites its
    file's table (NAME.md), or its JSON where there is no table: a large JSON file (every curve of a study) holds
    almost any decimal, so its numbers count only where the prose names the .json itself."""
    refs = set()
    for line in lines:
        m = DIRECTIVE.match(line.strip())
        if m:
            refs.add(f"{m.group(1)}.md" if (RESULTS / f"{m.group(1)}.md").is_file() else f"{m.group(1)}.json")
        refs |= {n for n in FILE_REF.findall(line) if (RESULTS / n).is_file()}
        refs |= {f"git:{c}" for c in COMMIT_REF.findall(line)}
    return refs


def corpus_text(ref: str) -> str:
    if ref.startswith("git:"):
        try:
            return subprocess.run(["git", "show", "-s", "--format=%B", ref[4:]], cwd=ROOT, capture_output=True,
                                  text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            pytest.skip(f"no git history here to read commit {ref[4:]}")
    return (RESULTS / ref).read_text()


def decimals(s: str) -> int:
    return len(s.split(".")[1]) if "." in s else 0


def rounds_to(x: Decimal, quoted: str) -> bool:
    q = Decimal(quoted)
    step = Decimal(1).scaleb(-decimals(quoted))
    return any(abs(x).quantize(step, rounding=r) == q for r in (ROUND_HALF_UP, ROUND_HALF_EVEN))


def found(figure: str, kind: str, text: str, numbers: list[str]) -> bool:
    if kind == "count":
        a, b = (int(v) for v in figure.split("/"))
        if re.search(rf"(?<!\d){a}\s*/\s*{b}(?!\d)", text):
            return True
        # a rate written at the file's precision (at least 3 decimals), or exactly
        return any((decimals(n) >= 3 and rounds_to(Decimal(str(a / b)), n)) or Decimal(n) == Decimal(a) / Decimal(b)
                   for n in numbers if "e" not in n)
    if kind == "sci":
        mant = figure.split("e")[0]
        digits = decimals(mant)
        want = f"{float(figure):.{digits}e}"
        return any(f"{float(n):.{digits}e}" == want for n in numbers if float(n) != 0)
    return any(_rounds_to_safe(n, figure) for n in numbers)


def _rounds_to_safe(n: str, figure: str) -> bool:
    """rounds_to for one number of a file; a token that only looks like one (a commit hash such as 4e6638f reads as
    4e6638, too large to quantize) matches nothing, and the file's other numbers are still tried."""
    try:
        return rounds_to(Decimal(n), figure)
    except InvalidOperation:
        return False


def quoted_figures(line: str) -> list[tuple[str, str]]:
    text = prose(line)
    figs = [(f"{a}/{b}", "count") for a, b in COUNT.findall(text)]
    text = COUNT.sub(" ", text)
    figs += [(s, "sci") for s in SCI.findall(text)]
    text = SCI.sub(" ", text)
    return figs + [(d, "decimal") for d in DECIMAL.findall(text)]


def unsupported(template: str) -> list[str]:
    bad = []
    for heading, blocks in sections(template):
        section_refs = set().union(*(cited(b) for b in blocks)) if blocks else set()
        for block in blocks:
            if DIRECTIVE.match(block[0].strip()):
                continue  # filled in from the file itself (checked by the first test)
            refs = cited(block) or section_refs
            text = "\n".join(corpus_text(r) for r in sorted(refs))
            numbers = NUMBER.findall(text)
            for line in block:
                for fig, kind in quoted_figures(line):
                    if not found(fig, kind, text, numbers):
                        where = ", ".join(sorted(refs)) or "no file"
                        bad.append(f"[{heading}] {fig} is not in {where}: {line.strip()[:120]}")
    return bad


def test_every_figure_quoted_is_in_a_file_it_cites():
    bad = unsupported(TEMPLATE.read_text())
    assert not bad, "figures the results page quotes but its cited files do not hold:\n" + "\n".join(bad)


def test_every_cited_file_exists():
    refs = set().union(*(cited(b) for _, blocks in sections(TEMPLATE.read_text()) for b in blocks))
    missing = [r for r in sorted(refs) if not r.startswith("git:") and not (RESULTS / r).is_file()]
    assert not missing, f"the results page cites files benchmarks/results/ does not hold: {missing}"


def test_the_checker_catches_a_wrong_figure():
    """A figure changed in the prose is reported, and one in the file is not."""
    text = ("## x\n\nWith experience 20/48 at p = 0.454, probe 0.34 ± 0.22, p = 3e-18 is elsewhere "
            "(`study_coevolution_before_ties.md`).\n")
    assert unsupported(text) == [f"[x] 3e-18 is not in study_coevolution_before_ties.md: {text.splitlines()[2].strip()[:120]}"]
    assert len(unsupported(text.replace("20/48", "27/48").replace("0.454", "0.455"))) == 3
