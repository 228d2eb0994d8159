"""A MkDocs hook: the benchmark figures under benchmarks/results/ join the site where they lie.

The studies keep their figures beside their rows and curves (benchmarks/results/STUDY/figures/),
and docs/ holds pages only; a page shows a figure by its path under the site's root, as
`benchmarks/results/STUDY/figures/NAME.png`.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for figure in sorted((REPO / "benchmarks" / "results").glob("**/figures/*.png")):
        path = str(figure.relative_to(REPO))
        files.append(File(path, str(REPO), config["site_dir"], config["use_directory_urls"]))
    return files
