"""promptemb.common.io: results appear whole or not at all, with the modes a plain write would give."""

import os

import pytest

from promptemb.common.io import atomic_write, atomic_write_json, umask_mode


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_atomic_write_json_has_plain_file_mode(tmp_path):
    path = atomic_write_json(tmp_path / "sub" / "results.json", {"a": 1})
    assert path.read_text() == '{\n  "a": 1\n}\n'
    assert (path.stat().st_mode & 0o777) == 0o666 & ~current_umask() == umask_mode()  # not mkstemp's 0600
    assert umask_mode(directory=True) == 0o777 & ~current_umask()


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = atomic_write_json(tmp_path / "results.json", {"old": True})

    def half_write(tmp):
        tmp.write_text('{"new": ')
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, half_write)
    assert path.read_text() == '{\n  "old": true\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
