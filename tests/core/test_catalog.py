"""The upstream catalogue (builder/catalog): the shipped file is valid against its schema, a
wrong type or an unknown key is refused naming file:line:key, and a site's catalog.yaml extends
it entry by entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder import catalog
from builder.errors import CatalogError


def test_shipped_catalogue_loads_and_answers() -> None:
    c = catalog.shipped()
    assert c.import_name("flash-attn") == "flash_attn"
    assert c.import_name("some-dist") == "some_dist"  # not catalogued: the usual spelling
    assert c.default_engine().name == "vllm"
    assert "tensordict" in c.required
    assert c.get("flash-attn").archs.generations[9] == "90"


def _site(tmp_path: Path, text: str) -> Path:
    (tmp_path / "catalog.yaml").write_text(text)
    return tmp_path


def test_unknown_key_names_file_line_key(tmp_path: Path) -> None:
    site = _site(tmp_path, "schema: 1\ndistributions:\n  foo:\n    import: foo\n    colour: red\n")
    with pytest.raises(CatalogError) as err:
        catalog.load(site)
    assert str(err.value) == (f"{site / 'catalog.yaml'}:5: distributions.foo.colour: unknown key "
                              "'colour' (allowed: abi, archs, block, extensions, import, native, "
                              "notes, sbom)")


def test_wrong_type_names_file_line_key(tmp_path: Path) -> None:
    site = _site(tmp_path, "schema: 1\ndistributions:\n  foo:\n    native: 'yes'\n")
    with pytest.raises(CatalogError) as err:
        catalog.load(site)
    assert str(err.value) == (f"{site / 'catalog.yaml'}:4: distributions.foo.native: expected "
                              "true or false, got 'yes'")


def test_site_extends_entry_by_entry(tmp_path: Path) -> None:
    site = _site(tmp_path, "schema: 1\ndistributions:\n  flash-attn:\n    notes: site wheels\n"
                           "  my-kernels:\n    import: mykern\n    native: true\n")
    c = catalog.load(site)
    assert c.import_name("my-kernels") == "mykern"
    fa = c.get("flash-attn")
    assert fa.notes == "site wheels" and fa.module == "flash_attn" and fa.archs is not None
    assert c.sources[-1] == str(site / "catalog.yaml")
