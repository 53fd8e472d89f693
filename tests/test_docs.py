"""The documentation site builds with every warning an error (broken links, missing pages, docstrings that
mkdocstrings cannot read); the README's links and the site's navigation name every page."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_site_builds_strictly(tmp_path):
    for module, package in (("mkdocs", "mkdocs"), ("material", "mkdocs-material"),
                            ("mkdocstrings_handlers.python", "mkdocstrings[python]")):
        pytest.importorskip(module, reason=f"{package} is not installed: pip install -e '.[docs]' to build the site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("segood.evaluation.api.evaluate", "segood.evaluation.results.Results",
                 "segood.evaluation.options.EvaluateOptions", "segood.metrics.arrays.fpr_at_tpr",
                 "segood.metrics.float_order.FloatOrderAccumulator", "segood.metrics.exact.ExactAccumulator",
                 "segood.methods.methods.get_method", "segood.data.h5.H5SegmentationDataset",
                 "segood.data.convert.mix", "segood.metrics.torchmetrics.BinaryOODMetrics"):
        assert name in api, f"{name} missing from the API reference"


def test_readme_is_short_and_its_links_exist():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links
    assert [link for link in links if not (ROOT / link).exists()] == []
    assert len(readme.splitlines()) <= 250


def test_every_docs_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f": {p.name}" not in nav] == []


def _table_rows(text, header):
    lines = text.splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_readme_headline_is_the_demo_tables_sun_rows():
    """The README's short table is the SUN rows of the demo's full table (docs/getting_started.md), verbatim."""
    header = "| method | set | AUROC ↑ | AUPRC ↑ | FPR95 ↓ | MaxIoU ↑ |"
    short = _table_rows((ROOT / "README.md").read_text(), header)
    full = _table_rows((ROOT / "docs" / "getting_started.md").read_text(), header)
    assert len(full) == 50 and len(short) == 10
    assert short == [row for row in full if row.split(" | ")[1] == "sun"]
