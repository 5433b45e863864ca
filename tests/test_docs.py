"""The docs site: `mkdocs build --strict` passes (so a broken link, a missing anchor or a page
left out of the nav fails make test), the strict build does fail on a broken link, and the
configuration reference is what docs/config_reference.py makes from the schema today."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

MKDOCS = Path(sys.executable).parent / "mkdocs"


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner, not ours
    return subprocess.run([str(MKDOCS), "build", "--strict", "--config-file", str(root / "mkdocs.yml"),
                           "--site-dir", str(site)], capture_output=True, text=True, env=env, timeout=300)


def test_the_site_builds_strictly_with_every_page_in_it(tmp_path):
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    for page in ("index.html", "getting-started/index.html", "architecture/index.html",
                 "configuration/index.html", "results/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    assert "mermaid" in (tmp_path / "site" / "architecture" / "index.html").read_text()


def build_with_line_added(tmp_path, line: str):
    """The site built from a copy of the docs whose getting-started page ends with `line`."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "getting-started.md"
    page.write_text(page.read_text() + f"\n{line}\n")
    return build(tmp_path, tmp_path / "site")


def test_a_broken_link_fails_the_strict_build(tmp_path):
    done = build_with_line_added(tmp_path, "See [a page that is not there](no-such-page.md).")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr


def test_a_missing_anchor_fails_the_strict_build(tmp_path):
    done = build_with_line_added(tmp_path, "See [a section that is not there](results.md#no-such-section).")
    assert done.returncode != 0
    assert "no-such-section" in done.stdout + done.stderr


def test_the_configuration_reference_is_generated_from_the_schema_as_it_is():
    done = subprocess.run([sys.executable, str(REPO / "docs" / "config_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_configuration_reference_names_every_key_of_the_schema():
    import dataclasses

    from transientvod.config import schema
    page = (REPO / "docs" / "configuration.md").read_text()
    config = schema.Config()
    for section in dataclasses.fields(config):
        value = getattr(config, section.name)
        if dataclasses.is_dataclass(value):
            for key in dataclasses.fields(value):
                assert f"| `{section.name}.{key.name}` |" in page, f"{section.name}.{key.name}"
        else:
            assert f"| `{section.name}` |" in page, section.name
    assert "| `exchange.staleness` | `0` |" in page
    assert "| `spot.time_scale` | `60.0` |" in page


def test_the_results_page_tables_are_what_their_json_renders_to():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "render_results.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    page = (REPO / "docs" / "results.md").read_text()
    marked = page.count("<!-- results: ")
    assert marked >= 7 and marked == page.count("<!-- /results -->")
    assert "```\ncodec" not in page  # the exchange tables come from JSON, not from text blocks


def test_a_figure_edited_on_the_page_by_hand_is_caught(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import render_results
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    page = (REPO / "docs" / "results.md").read_text()
    assert render_results.render(page) == page
    edited = page.replace("| none | 0 | 10.48 | 3.36 |", "| none | 0 | 10.48 | 3.96 |", 1)
    assert edited != page
    assert render_results.render(edited) == page  # rendering puts the JSON's figure back
    monkeypatch.setattr(render_results, "RESULTS", tmp_path)
    with pytest.raises(render_results.ResultsError, match="not in benchmarks/results/"):
        render_results.render(page)
