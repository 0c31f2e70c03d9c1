"""Names from a bucket joined to a local folder: `..`, absolute names, NULs and symlinks that point
out of the folder are refused, naming what was refused; plain names below the folder are joined."""

from __future__ import annotations

from pathlib import Path

import pytest
from disttrain_trainer.process.safe_paths import UnsafePath, contained


def test_names_that_would_leave_the_folder_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "staging"
    folder.mkdir()
    (tmp_path / "outside").mkdir()
    (folder / "link").symlink_to(tmp_path / "outside")
    assert contained(folder, "a/b.npy", what="key k") == folder / "a" / "b.npy"
    assert contained(folder, "state.pt", what="key k", flat=True) == folder / "state.pt"
    for name, why in (("../x", "'..' component"), ("a/../../x", "'..' component"), ("/etc/passwd", "is absolute"),
                      ("", "is empty"), ("a\x00b", "NUL"), ("link/x", "resolves to")):
        with pytest.raises(UnsafePath, match=why) as err:
            contained(folder, name, what=f"object key s3://b/{name}")
        assert f"object key s3://b/{name}" in str(err.value) and "refused" in str(err.value)
    with pytest.raises(UnsafePath, match="not a plain file name"):
        contained(folder, "sub/state.pt", what="marker entry", flat=True)
