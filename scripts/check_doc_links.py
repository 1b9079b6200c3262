#!/usr/bin/env python3
"""Check that the documentation's references resolve.

Three kinds of reference, in README.md, CHANGELOG.md and docs/**/*.md (and, for the second and
third, in the comments of the sources: src/, include/, templates/, tools/, tests/, scripts/,
python/, bench/, cmake/):

1. Markdown links `[text](target)` with a relative target: the file exists (the target is
   relative to the page), and a `#fragment` names one of its headings (GitHub's slugs).
2. Repository paths written out (`docs/kernels/forward_sm90.md`, `src/plan/Plan.cpp`,
   `src/kernels/forward/Sm90Wgmma.{h,cpp}`): each exists (a source may be named without its
   suffix, an include path relative to src/ or include/). Not in CHANGELOG.md, which names
   removed and renamed paths, nor in fenced code blocks. In a page, a bare page name
   (`backward_sm90.md`) must exist beside the page, in docs/ or in docs/kernels/.
3. Section citations, a page followed by a quoted title (`docs/tuning.md "Measured"`,
   `forward_sm90.md, "Union schedule"`): the page has a heading, or a paragraph that opens with
   an emphasized run-in title (`*The backward's dQ strategy.*`), that contains the title.

Usage: scripts/check_doc_links.py [--root DIR]. Prints one line per broken reference
(`file:line: what`) and exits 1 if there is any, 0 otherwise.
"""

import argparse
import itertools
import re
import sys
from pathlib import Path

TOP_DIRS = ("docs", "src", "include", "templates", "tools", "tests", "scripts", "python",
            "bench", "examples", "dsl", "cmake")
SOURCE_DIRS = ("src", "include", "templates", "tools", "tests", "scripts", "python", "bench",
               "cmake")
SOURCE_SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".py", ".sh", ".cmake", ".txt"}

PATH_RE = re.compile(r"(?<![\w/.$-])((?:%s)/[\w./+{},-]*[\w}])" % "|".join(TOP_DIRS))
LINK_RE = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
# A page, optionally ", " or "'s ", then a quoted title (straight or curly quotes).
CITE_RE = re.compile(r"((?:[\w/.-]+/)?[\w.-]+\.md)(?:,|'s)?\s+"
                     r"[\"\u201c]([^\"\u201d\n]{2,80})[\"\u201d]")
HEADING_RE = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
RUNIN_RE = re.compile(r"^\s*(?:[-*]\s+)?(\*{1,2})([^*\n]{2,120}?)\1")


def expand_braces(path):
    """a/B.{h,cpp} -> [a/B.h, a/B.cpp]."""
    parts = re.split(r"\{([^{}]*)\}", path)
    if len(parts) == 1:
        return [path]
    fixed, choices = parts[0::2], [p.split(",") for p in parts[1::2]]
    out = []
    for combo in itertools.product(*choices):
        s = fixed[0]
        for c, f in zip(combo, fixed[1:]):
            s += c + f
        out.append(s)
    return out


def slug(title):
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    t = re.sub(r"[`*_]", "", title.strip().lower())
    t = re.sub(r"[^\w\- ]", "", t)
    return t.replace(" ", "-")


class Page:
    """The headings and run-in titles of a markdown page."""

    def __init__(self, path):
        self.titles = []
        in_code = False
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if in_code:
                continue
            m = HEADING_RE.match(line)
            if m:
                self.titles.append(m.group(1))
                continue
            m = RUNIN_RE.match(line)
            if m:
                self.titles.append(m.group(2))
        self.slugs = {slug(t) for t in self.titles}

    def has_title(self, wanted):
        norm = lambda s: re.sub(r"\s+", " ", s.replace("`", "")).strip().lower()
        w = norm(wanted)
        return any(w in norm(t) for t in self.titles)


class Checker:
    def __init__(self, root):
        self.root = root
        self.pages = {}
        self.errors = []

    def page(self, path):
        key = path.resolve()
        if key not in self.pages:
            self.pages[key] = Page(path)
        return self.pages[key]

    def error(self, path, line, what):
        self.errors.append(f"{path.relative_to(self.root)}:{line}: {what}")

    def resolve_page(self, name, near):
        """A page named in `near` (a file): repository-relative, or beside it, or in docs/."""
        candidates = [self.root / name]
        if "/" not in name or not name.startswith(TOP_DIRS):
            candidates += [near.parent / name, self.root / "docs" / name,
                           self.root / "docs" / "kernels" / name]
        return next((c for c in candidates if c.is_file()), None)

    def path_exists(self, ref):
        """A repository path, a source named without its suffix (`src/cpu/ForwardKernel`), or
        an include path relative to src/ or include/ (`dsl/Lexer.h`)."""
        for base in (self.root, self.root / "src", self.root / "include"):
            p = base / ref
            if p.exists() or (p.parent.is_dir() and any(p.parent.glob(p.name + ".*"))):
                return True
        return False

    def check_paths(self, path, text, line_of):
        for m in PATH_RE.finditer(text):
            ref = m.group(1).rstrip(".,")
            if text[m.end():m.end() + 1] == "*" or "<" in ref or ref.endswith("/..."):
                continue  # a pattern (`BlockMaskBuild.*`, `mods_*.cuh`), not a path
            for p in expand_braces(ref):
                if not self.path_exists(p):
                    self.error(path, line_of(m.start()), f"no such file or directory: {p}")

    def check_citations(self, path, text, line_of):
        for m in CITE_RE.finditer(text):
            name, title = m.group(1), m.group(2)
            target = self.resolve_page(name, path)
            if target is None:
                self.error(path, line_of(m.start()), f"no such page: {name}")
            elif not self.page(target).has_title(title):
                self.error(path, line_of(m.start()), f'{name} has no section "{title}"')

    def check_markdown(self, path):
        raw = path.read_text(encoding="utf-8")
        # Fenced code blocks hold commands and sources, not references.
        text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), raw, flags=re.S)
        starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        line_of = lambda pos: next(i for i in range(len(starts), 0, -1) if starts[i - 1] <= pos)
        for m in LINK_RE.finditer(text):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("mailto:"):
                continue
            file_part, _, fragment = target.partition("#")
            dest = (path.parent / file_part) if file_part else path
            if not dest.exists():
                self.error(path, line_of(m.start()), f"broken link: {target}")
            elif fragment and dest.suffix == ".md" and fragment not in self.page(dest).slugs:
                self.error(path, line_of(m.start()),
                           f"no heading #{fragment} in {file_part or path.name}")
        if path.name != "CHANGELOG.md":  # the changelog names removed and renamed paths
            self.check_paths(path, text, line_of)
        # Bare page names (`backward_sm90.md`) in running text.
        for m in re.finditer(r"(?<![\w/.-])([\w-]+\.md)\b", text):
            if self.resolve_page(m.group(1), path) is None:
                self.error(path, line_of(m.start()), f"no such page: {m.group(1)}")
        self.check_citations(path, text, line_of)

    def check_source(self, path):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        # Join each run of comment lines into one text so that a citation may wrap.
        text, origin = [], []
        for n, line in enumerate(lines, 1):
            m = re.match(r"^\s*(//+|#+)\s?(.*)$", line)
            piece = m.group(2) if m else line
            text.append(piece)
            origin.append(n)
        joined, offsets = "", []
        for piece, n in zip(text, origin):
            offsets.append((len(joined), n))
            joined += piece + " "
        def line_of(pos):
            line = 1
            for start, n in offsets:
                if start > pos:
                    break
                line = n
            return line
        self.check_paths(path, joined, line_of)
        self.check_citations(path, joined, line_of)

    def run(self):
        pages = [self.root / "README.md", self.root / "CHANGELOG.md"]
        pages += sorted((self.root / "docs").rglob("*.md"))
        for p in pages:
            if p.is_file():
                self.check_markdown(p)
        for d in SOURCE_DIRS:
            base = self.root / d
            if not base.is_dir():
                continue
            for p in sorted(base.rglob("*")):
                if p.is_file() and (p.suffix in SOURCE_SUFFIXES or p.name == "CMakeLists.txt") \
                        and "corpus" not in p.parts and "goldens" not in p.parts:
                    self.check_source(p)
        return self.errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=Path(__file__).resolve().parent.parent, type=Path,
                    help="the repository root (default: this script's checkout)")
    args = ap.parse_args()
    errors = Checker(args.root.resolve()).run()
    for e in errors:
        print(e)
    sys.stdout.flush()
    if errors:
        print(f"{len(errors)} broken reference(s)", file=sys.stderr)
        return 1
    print("every reference resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
