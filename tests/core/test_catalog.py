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
                              "'colour' (allowed: abi, archs, block, checks, extensions, import, "
                              "locked, native, notes, sbom)")


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


def test_layers_are_typed_and_their_packages_catalogued() -> None:
    """Each distribution a stack layer adds and the gate imports is a catalogue entry with its
    own ``import:`` (the layer names no module itself)."""
    c = catalog.shipped()
    assert c.layers, "the shipped catalogue has a stack layer"
    for layer in c.layers.values():
        assert layer.extras and set(layer.versions) <= layer.keys
        for p in layer.packages:
            assert p.source in layer.keys, (layer.name, p.name)
            if p.imported:
                d = c.get(p.name)
                assert d is not None and d.module, (layer.name, p.name)


def test_a_bad_layer_entry_names_file_line_key(tmp_path: Path) -> None:
    site = _site(tmp_path, "schema: 1\nlayers:\n  mine:\n    extras: [x]\n    versions: []\n"
                           "    packages: {a: {build: wheel}}\n")
    with pytest.raises(CatalogError) as err:
        catalog.load(site)
    assert f"{site / 'catalog.yaml'}:6: layers.mine.packages.a.build" in str(err.value)


def test_engine_trainer_overrides_per_family() -> None:
    c = catalog.shipped()
    assert c.trainer_overrides("rocm") and not c.trainer_overrides("cuda")
