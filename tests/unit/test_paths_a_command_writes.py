"""The rules for the paths a command will write (testbed/checks.py), each refusal held to
its exact words and each side of it shown: a file's folder must exist and be writable, a
folder is made under the nearest existing one, a run's folder is new or empty (#71). The
suite runs as root, for whom every path is writable: the unwritable cases ask os.access."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed import checks
from testbed.errors import UsageError


def _refusal(call) -> tuple[str, str, str]:
    with pytest.raises(UsageError) as refused:
        call()
    return refused.value.field, refused.value.problem, refused.value.fix


def _unwritable(monkeypatch, *paths):
    denied = {str(p) for p in paths}
    real = os.access
    monkeypatch.setattr(checks.os, "access", lambda p, mode: (
        False if str(p) in denied and mode == os.W_OK else real(p, mode)))


def test_a_file_in_a_writable_folder_passes_new_or_existing(tmp_path):
    assert checks.writable_file("--json", str(tmp_path / "rows.jsonl")) is None
    (tmp_path / "rows.jsonl").write_text("{}")
    assert checks.writable_file("--json", str(tmp_path / "rows.jsonl")) is None


def test_a_file_that_is_a_folder_or_in_no_folder_is_refused_by_name(tmp_path):
    assert _refusal(lambda: checks.writable_file("--json", str(tmp_path))) == (
        "--json", f"{tmp_path} is a folder",
        f"Give a file name, e.g. --json {tmp_path / 'rows.jsonl'}")
    missing = tmp_path / "no" / "rows.jsonl"
    assert _refusal(lambda: checks.writable_file("--json", str(missing))) == (
        "--json", f"the folder {tmp_path / 'no'} does not exist",
        "Create it first, or give a file in a folder that exists")


def test_a_file_whose_folder_or_itself_cannot_be_written_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "rows.jsonl"
    _unwritable(monkeypatch, tmp_path)
    assert _refusal(lambda: checks.writable_file("--json", str(target))) == (
        "--json", f"{target} cannot be written here", "Give a writable path")
    monkeypatch.undo()
    target.write_text("")
    _unwritable(monkeypatch, target)
    assert _refusal(lambda: checks.writable_file("--json", str(target)))[1] == (
        f"{target} cannot be written here")
    # a file not there yet is not asked about (os.access of a missing file is False)
    monkeypatch.undo()
    _unwritable(monkeypatch, tmp_path / "new.jsonl")
    assert checks.writable_file("--json", str(tmp_path / "new.jsonl")) is None


def test_a_folder_is_made_under_the_nearest_existing_one(tmp_path):
    assert checks._nearest_existing(tmp_path / "a" / "b" / "c") == tmp_path
    assert checks._nearest_existing(tmp_path) == tmp_path
    assert checks._nearest_existing(Path("/no-such-lossbed-folder/x")) == Path("/")
    (tmp_path / "f").write_text("")
    assert checks._nearest_existing(tmp_path / "f" / "x") == tmp_path / "f"
    assert str(checks._nearest_existing(tmp_path.parent / "no" / "such")) == str(tmp_path.parent)


def test_a_folder_passes_new_existing_or_nested(tmp_path):
    for folder in (tmp_path, tmp_path / "new", tmp_path / "new" / "deeper"):
        assert checks.writable_folder("--out", str(folder)) is None


def test_a_folder_that_is_a_file_or_under_one_or_unwritable_is_refused(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("")
    assert _refusal(lambda: checks.writable_folder("--out", str(tmp_path / "f"))) == (
        "--out", f"{tmp_path / 'f'} is a file, not a folder", "Give a folder")
    under = tmp_path / "f" / "x"
    assert _refusal(lambda: checks.writable_folder("--out", str(under))) == (
        "--out", f"{tmp_path / 'f'} is a file: {under} cannot be made under it",
        "Give a folder")
    _unwritable(monkeypatch, tmp_path)
    made = tmp_path / "new" / "deeper"
    assert _refusal(lambda: checks.writable_folder("--out", str(made))) == (
        "--out", f"{made} cannot be created: {tmp_path} is not writable",
        "Give a writable folder")


def test_a_relative_folder_is_judged_from_where_the_user_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("")
    assert _refusal(lambda: checks.writable_folder("--out", "f/x"))[1] == (
        f"{tmp_path / 'f'} is a file: f/x cannot be made under it")


def test_a_runs_folder_is_new_or_empty_and_comes_back_absolute(tmp_path, monkeypatch):
    assert checks.new_folder(None, "--out") is None
    monkeypatch.chdir(tmp_path)
    assert checks.new_folder("run1", "--out") == str(tmp_path / "run1")
    (tmp_path / "empty").mkdir()
    assert checks.new_folder("empty", "--out") == str(tmp_path / "empty")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    (tmp_path / "file").write_text("")
    for taken in ("used", "file"):
        assert _refusal(lambda taken=taken: checks.new_folder(taken, "--out")) == (
            "--out", f"{tmp_path / taken} exists and is not an empty folder",
            "Give a new folder (nothing is overwritten)")
