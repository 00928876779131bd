"""populora_core.services.files: a write lands whole or not at all, and leaves no temporary behind."""

import pytest

from populora_core.services.files import atomic_dir, atomic_path, atomic_write_bytes, atomic_write_text


def test_a_file_is_replaced_whole_and_a_failed_write_keeps_the_old_one(tmp_path):
    target = tmp_path / "sub" / "state.json"
    atomic_write_text(target, "old")
    atomic_write_bytes(target, b"new", fsync=False)
    assert target.read_text() == "new"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt  # a kill while the new content is being written
    assert target.read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]


def test_a_folder_appears_whole_and_replaces_only_when_asked(tmp_path):
    dest = tmp_path / "v1"
    with atomic_dir(dest) as tmp:
        (tmp / "a").write_text("1")
        assert not dest.exists()
    assert (dest / "a").read_text() == "1"
    with pytest.raises(OSError):
        with atomic_dir(dest) as tmp:
            (tmp / "b").write_text("2")
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(dest, replace=True) as tmp:
            (tmp / "b").write_text("2")
            raise KeyboardInterrupt
    assert sorted(p.name for p in dest.iterdir()) == ["a"]
    with atomic_dir(dest, replace=True) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in dest.iterdir()) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_what_is_written_follows_the_users_umask(tmp_path, umask):
    """Run files on a shared file system must be readable by whom the umask allows (Ray workers, colleagues):
    folders were 0700 (tempfile.mkdtemp) whatever the umask."""
    import os

    old = os.umask(umask)
    try:
        with atomic_dir(tmp_path / "adapter") as tmp:
            atomic_write_text(tmp / "adapter_config.json", "{}")
        atomic_write_bytes(tmp_path / "members.json", b"[]")
    finally:
        os.umask(old)
    assert (tmp_path / "adapter").stat().st_mode & 0o777 == 0o777 & ~umask
    for file in (tmp_path / "adapter" / "adapter_config.json", tmp_path / "members.json"):
        assert file.stat().st_mode & 0o777 == 0o666 & ~umask
