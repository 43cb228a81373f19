"""One spelling per lake location: local paths, file URIs and object-store URIs normalize the same way everywhere."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schemas.uris import is_local, local_path, normalize_uri, same_location, table_uri


def test_local_spellings_of_one_folder_are_one_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    absolute = str(tmp_path / "lake")
    spellings = ["lake", "./lake", "lake/", "lake//", "./x/../lake", absolute, absolute + "/", "file://lake"]
    spellings += ["file://" + absolute, "file://" + absolute + "/", "file://localhost" + absolute, "file:" + absolute]
    for spelling in spellings:
        assert normalize_uri(spelling) == absolute, spelling
    assert normalize_uri(Path("lake")) == absolute
    assert normalize_uri("file://" + absolute.replace("lake", "my%20lake")) == str(tmp_path / "my lake")
    assert normalize_uri("//" + absolute.lstrip("/")) == absolute
    assert normalize_uri("~/lake") == os.path.join(os.path.expanduser("~"), "lake")
    assert table_uri("lake/", "transitions") == str(tmp_path / "lake" / "transitions")
    assert local_path("file://lake") == absolute and is_local("lake") and is_local("file:///x")


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("s3://bucket/lake", "s3://bucket/lake"),
        ("s3://bucket/lake/", "s3://bucket/lake"),
        ("s3://bucket//lake///", "s3://bucket/lake"),
        ("S3://bucket/./lake", "s3://bucket/lake"),
        ("s3a://bucket/lake/", "s3://bucket/lake"),
        ("s3n://bucket/lake", "s3://bucket/lake"),
        ("s3://bucket/", "s3://bucket"),
        ("gs://bucket/a//b/", "gs://bucket/a/b"),
        ("az://container/lake/", "az://container/lake"),
        (
            "abfss://container@account.dfs.core.windows.net//lake/",
            "abfss://container@account.dfs.core.windows.net/lake",
        ),
        ("abfs://container@account.dfs.core.windows.net/lake", "abfs://container@account.dfs.core.windows.net/lake"),
        ("s3://bucket/a/../b", "s3://bucket/a/../b"),  # object stores take '..' literally
    ],
)
def test_object_store_uris_keep_their_scheme_and_lose_stray_slashes(spelling: str, expected: str) -> None:
    assert normalize_uri(spelling) == expected
    assert not is_local(spelling)
    assert table_uri(spelling, "transitions") == expected + "/transitions"
    with pytest.raises(ValueError, match="not a local path"):
        local_path(spelling)


def test_same_location_and_errors() -> None:
    assert same_location("s3a://b/lake/", "s3://b//lake")
    assert not same_location("s3://b/lake", "gs://b/lake")
    assert not same_location("s3://b/lake", None) and same_location(None, None)
    with pytest.raises(ValueError, match="empty"):
        normalize_uri("  ")


def test_every_layer_names_a_table_the_same_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelines (Lake.uri), the trainer's reader, the registry and the lineage table agree on each spelling."""
    from schemas.lake import Lake
    from trainer.lineage import Lineage
    from trainer.registry import Registry

    monkeypatch.chdir(tmp_path)
    spellings = ["lake", "./lake/", str(tmp_path / "lake"), str(tmp_path / "lake") + "/", f"file://{tmp_path}/lake"]
    expected = str(tmp_path / "lake" / "transitions")
    for root in spellings:
        assert Lake(root).uri("transitions") == expected, root
        assert Lineage(Lake(root)).uri == str(tmp_path / "lake" / "training_lineage"), root
        assert Registry(Lake(root)).uri == str(tmp_path / "lake" / "model_versions"), root
    assert Lake("s3a://bucket/lake/").uri("transitions") == "s3://bucket/lake/transitions"
    assert Registry(Lake("s3://bucket//lake")).uri == "s3://bucket/lake/model_versions"
