#!/usr/bin/env python3
"""Tests of tools/doc_links.py (stdlib unittest; `make test` runs them)."""

from __future__ import annotations

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_links  # noqa: E402


class DocLinksTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        os.mkdir(os.path.join(self.root, "docs"))
        self.write(
            "docs/model.md",
            "# Model\n\n## The `W` of a node\n\n## Notes\n\n## Notes\n\n<a id=\"w\"></a>**W**\n\n"
            "```text\n# not a heading\n[x](missing.md)\n```\n",
        )

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def write(self, rel: str, text: str) -> None:
        with open(os.path.join(self.root, rel), "w", encoding="utf-8") as f:
            f.write(text)

    def test_good_links_pass(self) -> None:
        self.write(
            "README.md",
            "[a](docs/model.md) [b](docs/model.md#the-w-of-a-node) [c](docs/model.md#notes-1) "
            "[d](docs/model.md#w) [e](https://example.com/x#y) [f](docs/) [g](#readme)\n\n# README\n"
            "`[not a link](nowhere.md)`\n",
        )
        self.assertEqual(doc_links.check(self.root), [])

    def test_broken_file_and_anchor_are_named(self) -> None:
        self.write("README.md", "x\n[a](docs/nope.md)\n[b](docs/model.md#not-a-heading)\n")
        self.assertEqual(
            doc_links.check(self.root),
            [
                "README.md:2: docs/nope.md: no such file",
                "README.md:3: docs/model.md#not-a-heading: docs/model.md has no anchor #not-a-heading",
            ],
        )

    def test_the_repository_has_no_broken_link(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.assertEqual(doc_links.check(root), [])


if __name__ == "__main__":
    unittest.main()
