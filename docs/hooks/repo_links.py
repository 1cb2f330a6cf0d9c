"""mkdocs hook: links from a page to files of the repository outside docs/.

docs/results.md links its figures to bench/results/*.json, and guides link to examples/;
those files are not part of the site, so mkdocs reports the links as not found (a
warning, an error under --strict). This hook checks each such link against the
repository instead: a target that exists becomes its path in code (`bench/results/x.json`,
"in the repository"), and a target that does not exist is logged as a warning, so a
broken link still fails the strict build.
"""
from __future__ import annotations

import logging
import os
import re

log = logging.getLogger("mkdocs.plugins.repo_links")

# [label](target) or [label](target#anchor), target relative (no scheme, not absolute)
_LINK = re.compile(r"\[([^\]\n]*)\]\((?![a-z][a-z0-9+.-]*:|/|#)([^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown, page, config, files):
    docs = os.path.abspath(config["docs_dir"])
    repo = os.path.dirname(docs)
    here = os.path.dirname(os.path.join(docs, page.file.src_path))

    def replace(m):
        label, target = m.group(1), m.group(2)
        path = os.path.normpath(os.path.join(here, target))
        if path == docs or path.startswith(docs + os.sep):
            return m.group(0)                      # inside docs/: mkdocs checks it
        rel = os.path.relpath(path, repo)
        if rel.startswith(".."):
            log.warning("%s: link %r points outside the repository", page.file.src_path,
                        target)
            return m.group(0)
        if not os.path.exists(path):
            log.warning("%s: link %r: %s does not exist in the repository",
                        page.file.src_path, target, rel)
            return m.group(0)
        code = label.strip("`")
        return f"`{code}`" if code == rel else f"{label} (`{rel}` in the repository)"

    return _LINK.sub(replace, markdown)
