"""What the built distributions hold: the sdist exactly its listed files, the wheel's metadata
only the public extras and a description that stands on a package index page."""

from __future__ import annotations

import re
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESCRIPTION = ROOT / "docs" / "package-description.md"
PUBLIC_EXTRAS = {"binary", "etcd", "otel", "prometheus", "redis", "web"}

builders = pytest.importorskip("hatchling.builders.sdist")
wheel_builders = pytest.importorskip("hatchling.builders.wheel")


def _links(markdown: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)", markdown)


def test_the_sdist_holds_its_listed_files_and_no_vcs_ignore_file(tmp_path: Path) -> None:
    [archive] = builders.SdistBuilder(str(ROOT)).build(directory=str(tmp_path))
    with tarfile.open(archive) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    top = {name for name in names if not name.startswith("src/worklease/")}
    assert top == {
        "CHANGELOG.md",
        "LICENSE",
        "PKG-INFO",
        "README.md",
        "docs/package-description.md",
        "hatch_build.py",
        "pyproject.toml",
    }
    assert "src/worklease/__init__.py" in names
    assert "src/worklease/schema.sql" in names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


def test_the_wheel_offers_only_the_public_extras_and_the_package_description(
    tmp_path: Path,
) -> None:
    [wheel] = wheel_builders.WheelBuilder(str(ROOT)).build(directory=str(tmp_path))
    with zipfile.ZipFile(wheel) as archive:
        [metadata_name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(metadata_name).decode())
        names = set(archive.namelist())
    # the console's script and styles ship inside the package (served from it)
    assert {"worklease/web/static/console.js", "worklease/web/static/console.css"} <= names
    assert set(metadata.get_all("Provides-Extra") or []) == PUBLIC_EXTRAS
    requirements = " ".join(metadata.get_all("Requires-Dist") or [])
    for benchmark_only in ("matplotlib", "pals", "dbos", "SQLAlchemy"):
        assert benchmark_only not in requirements
    description = metadata.get_payload()
    assert isinstance(description, str)
    assert description.strip() == DESCRIPTION.read_text(encoding="utf-8").strip()


def test_the_package_description_links_nowhere_relative() -> None:
    """A package index shows the description without the repository around it: a relative
    link there leads nowhere (the README's do; it is not the description)."""
    text = DESCRIPTION.read_text(encoding="utf-8")
    relative = [link for link in _links(text) if not re.match(r"(https?:|mailto:|#)", link)]
    assert relative == []
    assert _links((ROOT / "README.md").read_text(encoding="utf-8")), "the check finds links"
