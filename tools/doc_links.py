#!/usr/bin/env python3
"""Check the relative links of the repository's Markdown pages (stdlib only; `make test` runs it).

    python3 tools/doc_links.py [ROOT]          # ROOT: the repository (default: this file's parent's)

Every `[text](target)` outside fenced code blocks whose target is not a URL (http, https,
mailto) must name an existing file or directory, relative to the page; a `#fragment` into a
Markdown page must be one of its anchors: a heading's GitHub slug (lower case, punctuation other
than `-` and `_` dropped, spaces to `-`, a repeated slug suffixed `-1`, `-2`, ...) or an
`<a id="...">`. Pages under target/, fuzz/target/ and .git/ are skipped.

Prints one line per broken link, `PAGE:LINE: LINK: why`, then a count; exit 1 when any is
broken, 0 when none.
"""

from __future__ import annotations

import os
import re
import sys

SKIP_DIRS = {"target", ".git", "node_modules"}
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, line


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: inline code, links and emphasis reduced to their text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.lower().replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(HTML_ID.findall(line))
    return found


def pages(root: str) -> list[str]:
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        out.extend(os.path.join(d, f) for f in sorted(files) if f.endswith(".md"))
    return out


def check(root: str) -> list[str]:
    cache: dict[str, set[str]] = {}

    def anchors_of(path: str) -> set[str]:
        if path not in cache:
            with open(path, encoding="utf-8") as f:
                cache[path] = anchors(f.read())
        return cache[path]

    broken = []
    for page in pages(root):
        with open(page, encoding="utf-8") as f:
            text = f.read()
        rel = os.path.relpath(page, root)
        for n, line in prose_lines(text):
            # inline code spans are not links
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                link = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", link):
                    continue
                path, _, frag = link.partition("#")
                target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                if not os.path.exists(target):
                    broken.append(f"{rel}:{n}: {link}: no such file")
                elif frag and target.endswith(".md") and frag not in anchors_of(target):
                    broken.append(f"{rel}:{n}: {link}: {os.path.relpath(target, root)} has no anchor #{frag}")
    return broken


def main(argv: list[str]) -> int:
    root = argv[0] if argv else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    broken = check(root)
    for b in broken:
        print(b)
    print(f"doc_links: {len(pages(root))} pages, {len(broken)} broken links")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
