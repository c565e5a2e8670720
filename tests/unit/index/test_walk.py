"""walk_roots and classify_file on real trees: plain folders with nested .gitignore files, real git
repositories, every skip reason made real on disk, multi-root, and the standard library for speed."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from pathlib import Path

import pytest

from context.index import walk
from context.index.types import SourceFile
from context.index.walk import GitignoreRules, classify_file, walk_roots

STDLIB = Path(sysconfig.get_paths()["stdlib"])
PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2


def write(path: Path, content: str | bytes = "print('hello')\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def git(repo: Path, *args: str) -> None:
    command = ["git", "-c", "user.email=test@example.com", "-c", "user.name=Test", *args]
    subprocess.run(command, cwd=repo, check=True, capture_output=True, timeout=30)


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    return path


def rels(result) -> list[str]:
    return [source.rel for source in result.files]


def skips(result) -> dict[str, int]:
    return dict(result.skipped)


# ---------------------------------------------------------------- what gets listed


def test_plain_tree_lists_text_files_with_their_stat(tmp_path):
    write(tmp_path / "a.py")
    write(tmp_path / "docs" / "guide.md", "# Guide\n")
    write(tmp_path / "empty.txt", "")
    result = walk_roots([tmp_path])
    assert rels(result) == ["a.py", "docs/guide.md", "empty.txt"]
    assert skips(result) == {}
    guide = result.files[1]
    info = (tmp_path / "docs" / "guide.md").stat()
    assert guide == SourceFile(tmp_path, tmp_path / "docs" / "guide.md", "docs/guide.md", 8, info.st_mtime)


def test_git_repo_lists_tracked_and_untracked_but_not_ignored(tmp_path):
    repo = make_repo(tmp_path / "repo")
    write(repo / ".gitignore", "*.log\nout/\n")
    write(repo / "tracked.py")
    write(repo / "build" / "lib.py")  # a build folder git does not ignore is source here
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "init")
    write(repo / "untracked.py")
    write(repo / "debug.log", "noise\n")
    write(repo / "out" / "gen.py")
    write(repo / "node_modules" / "pkg" / "index.js", "module.exports = 1;\n")
    result = walk_roots([repo])
    assert rels(result) == [".gitignore", "build/lib.py", "tracked.py", "untracked.py"]
    # git's ignored files are not listed at all; a cache folder git lists is skipped per file
    assert skips(result) == {"ignored": 1}


def test_root_that_is_a_subfolder_of_a_repo(tmp_path):
    repo = make_repo(tmp_path / "repo")
    write(repo / "top.py")
    write(repo / "pkg" / "mod.py")
    write(repo / "pkg" / "sub" / "deep.py")
    write(repo / "pkg" / ".gitignore", "*.tmp\n")
    write(repo / "pkg" / "scratch.tmp", "x\n")
    git(repo, "add", "top.py", "pkg/mod.py")
    result = walk_roots([repo / "pkg"])
    assert rels(result) == [".gitignore", "mod.py", "sub/deep.py"]
    assert all(source.root == repo / "pkg" for source in result.files)


def test_root_ignored_by_its_enclosing_repo_is_walked(tmp_path):
    home = make_repo(tmp_path / "home")
    write(home / ".gitignore", "projects/\n")
    write(home / "projects" / "app" / "main.py")
    write(home / "projects" / "app" / "build" / "out.py")
    result = walk_roots([home / "projects" / "app"])
    assert rels(result) == ["main.py"]
    assert skips(result) == {"ignored": 1}  # build/ skipped as outside git
    assert isinstance(
        classify_file(home / "projects" / "app", home / "projects" / "app" / "main.py"), SourceFile
    )


def test_files_are_listed_once_across_links_and_nested_roots(tmp_path):
    write(tmp_path / "a" / "real.py")
    os.symlink(tmp_path / "a" / "real.py", tmp_path / "a" / "alias.py")
    os.link(tmp_path / "a" / "real.py", tmp_path / "a" / "hard.py")
    write(tmp_path / "a" / "inner" / "x.py")
    result = walk_roots([tmp_path / "a", tmp_path / "a" / "inner", tmp_path / "a"])
    assert len(result.files) == 2
    assert {source.rel for source in result.files} & {"alias.py", "hard.py", "real.py"}
    inner = [source for source in result.files if source.path.name == "x.py"]
    assert [(source.root, source.rel) for source in inner] == [(tmp_path / "a" / "inner", "x.py")]
    assert skips(result) == {}


def test_multiple_roots_keep_their_own_root(tmp_path):
    plain = tmp_path / "plain"
    write(plain / "one.py")
    repo = make_repo(tmp_path / "repo")
    write(repo / "two.go", "package main\n")
    missing = tmp_path / "missing"
    result = walk_roots([plain, repo, missing])
    assert [(source.root, source.rel) for source in result.files] == [(plain, "one.py"), (repo, "two.go")]


# ---------------------------------------------------------------- ignore rules outside git


def nested_gitignore_tree(root: Path) -> None:
    write(root / ".gitignore", "# top\n*.tmp\n/only_top.txt\nlogs/\n*.log\n!important.log\n")
    write(root / "x.tmp", "t\n")
    write(root / "only_top.txt", "t\n")
    write(root / "main.py")
    write(root / "secret.py")
    write(root / "logs" / "a.txt", "t\n")
    write(root / "important.log", "t\n")
    write(root / "sub" / ".gitignore", "!keep.tmp\nsecret.py\n**/deep/*.cfg\nraw[0-9].csv\n")
    write(root / "sub" / "keep.tmp", "t\n")
    write(root / "sub" / "other.tmp", "t\n")
    write(root / "sub" / "only_top.txt", "t\n")
    write(root / "sub" / "secret.py")
    write(root / "sub" / "a" / "deep" / "x.cfg", "t\n")
    write(root / "sub" / "a" / "deep" / "x.ini", "t\n")
    write(root / "sub" / "raw1.csv", "t\n")
    write(root / "sub" / "rawx.csv", "t\n")
    write(root / "node_modules" / "m" / "index.js", "x\n")
    write(root / "__pycache__" / "main.cpython-311.pyc", b"\0\0")
    write(root / "dist" / "bundle.js", "x\n")
    write(root / "env" / "pyvenv.cfg", "home = /usr\n")
    write(root / "env" / "lib" / "thing.py")
    write(root / "venv" / "__init__.py")  # a package called venv, not an environment


def test_nested_gitignore_outside_git(tmp_path):
    nested_gitignore_tree(tmp_path)
    result = walk_roots([tmp_path])
    assert rels(result) == [
        ".gitignore",
        "important.log",
        "main.py",
        "secret.py",
        "sub/.gitignore",
        "sub/a/deep/x.ini",
        "sub/keep.tmp",
        "sub/only_top.txt",
        "sub/rawx.csv",
        "venv/__init__.py",
    ]
    # files: x.tmp, only_top.txt, sub/other.tmp, sub/secret.py, x.cfg, raw1.csv;
    # folders (once each): logs, node_modules, __pycache__, dist, env
    assert skips(result) == {"ignored": 11}


def test_classify_file_agrees_with_the_walk(tmp_path):
    nested_gitignore_tree(tmp_path / "plain")
    repo = make_repo(tmp_path / "repo")
    nested_gitignore_tree(repo)
    git(repo, "add", "main.py")
    for root in (tmp_path / "plain", repo):
        listed = {source.path: source for source in walk_roots([root]).files}
        for path in root.rglob("*"):
            if path.is_dir() or ".git" in path.relative_to(root).parts:
                continue
            verdict = classify_file(root, path)
            if path in listed:
                assert verdict == listed[path], path
            else:
                assert verdict == "ignored", path


@pytest.mark.parametrize(
    ("line", "rel", "is_dir", "expected"),
    [
        ("*.py", "a/b/c.py", False, True),
        ("*.py", "a/b/c.pyx", False, None),
        ("build/", "x/build", True, True),
        ("build/", "x/build", False, None),
        ("/top.txt", "top.txt", False, True),
        ("/top.txt", "a/top.txt", False, None),
        ("a/*.txt", "a/b.txt", False, True),
        ("a/*.txt", "a/b/c.txt", False, None),
        ("**/deep", "x/y/deep", True, True),
        ("**/deep", "deep", True, True),
        ("a/**/z.md", "a/z.md", False, True),
        ("a/**/z.md", "a/b/c/z.md", False, True),
        ("logs/**", "logs/a/b.txt", False, True),
        ("file?.txt", "file1.txt", False, True),
        ("file?.txt", "file12.txt", False, None),
        ("[!a]*.c", "b.c", False, True),
        ("[!a]*.c", "a.c", False, None),
        ("!keep.py", "keep.py", False, False),
        ("\\#hash", "#hash", False, True),
        ("# comment", "# comment", False, None),
    ],
)
def test_gitignore_pattern_forms(line, rel, is_dir, expected):
    assert GitignoreRules("", [line]).match(rel, is_dir) is expected


def test_gitignore_rules_apply_below_their_folder_only():
    rules = GitignoreRules("sub", ["/anchored.py", "loose.py"])
    assert rules.match("sub/anchored.py", False) is True
    assert rules.match("sub/x/anchored.py", False) is None
    assert rules.match("sub/x/loose.py", False) is True
    assert rules.match("loose.py", False) is None


# ---------------------------------------------------------------- skip reasons


def test_binary_file_is_skipped(tmp_path):
    write(tmp_path / "ok.py")
    write(tmp_path / "image.dat", b"GIF89a\0\0\1\2" + b"x" * 100)
    result = walk_roots([tmp_path])
    assert rels(result) == ["ok.py"] and skips(result) == {"binary": 1}
    assert classify_file(tmp_path, tmp_path / "image.dat") == "binary"


def test_non_utf8_file_is_skipped_as_binary(tmp_path):
    write(tmp_path / "latin1.py", "name = 'café'\n".encode("latin-1"))
    assert skips(walk_roots([tmp_path])) == {"binary": 1}


def test_multibyte_character_across_the_head_boundary_is_text(tmp_path):
    line = "# " + "x" * 60 + "\n"
    head = line * (walk.HEAD_BYTES // len(line))
    padding = "y" * (walk.HEAD_BYTES - len(head) - 1)
    content = (head + padding + "é" + "\nprint(1)\n").encode("utf-8")
    assert content[walk.HEAD_BYTES - 1 : walk.HEAD_BYTES + 1] == "é".encode()
    write(tmp_path / "long.py", content)
    assert rels(walk_roots([tmp_path])) == ["long.py"]


def test_minified_javascript_is_skipped_as_generated(tmp_path):
    write(tmp_path / "app.js", "var a=1;" * 2_000 + "\n")
    write(tmp_path / "vendor.min.js", "var a = 1;\n")  # by name, even when short
    write(tmp_path / "normal.js", "const a = 1;\n" * 50 + "// " + "long comment " * 100 + "\n")
    result = walk_roots([tmp_path])
    assert rels(result) == ["normal.js"]
    assert skips(result) == {"generated": 2}


@pytest.mark.parametrize("name", ["package-lock.json", "Cargo.lock", "poetry.lock", "uv.lock", "go.sum"])
def test_lock_files_are_skipped_as_generated(tmp_path, name):
    write(tmp_path / "sub" / name, "{}\n")
    assert skips(walk_roots([tmp_path])) == {"generated": 1}


@pytest.mark.parametrize(
    "header",
    [
        "// Code generated by protoc-gen-go. DO NOT EDIT.\n",
        "# @generated by tooling\n",
        "/* This file is autogenerated. */\n",
    ],
)
def test_generated_markers_in_the_first_lines(tmp_path, header):
    write(tmp_path / "gen.go", "\n" + header + "package x\n")
    write(tmp_path / "late.go", "package x\n" * 10 + header)  # past the first lines: just a comment
    assert rels(walk_roots([tmp_path])) == ["late.go"]


def test_prose_with_long_lines_is_not_generated(tmp_path):
    paragraph = "This paragraph was written without hard wraps. " * 40
    write(tmp_path / "README.md", f"# Title\n\n{paragraph}\n\n{paragraph}\n")
    assert rels(walk_roots([tmp_path])) == ["README.md"]


def test_size_limit_is_inclusive(tmp_path):
    write(tmp_path / "fits.txt", "x" * 999 + "\n")
    write(tmp_path / "over.txt", "x" * 1000 + "\n")
    result = walk_roots([tmp_path], max_file_bytes=1000)
    assert rels(result) == ["fits.txt"] and skips(result) == {"too_large": 1}


def bytes_read_by_this_process() -> int:
    with open("/proc/self/io", encoding="ascii") as handle:
        return int(next(line for line in handle if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io to count reads")
def test_fifty_megabyte_single_line_is_never_read_whole(tmp_path):
    big = tmp_path / "data.json"
    with open(big, "wb") as handle:
        for _ in range(50):
            handle.write(b"7" * 1_000_000)
    before = bytes_read_by_this_process()
    started = time.monotonic()
    assert skips(walk_roots([tmp_path])) == {"too_large": 1}
    assert classify_file(tmp_path, big, max_file_bytes=100_000_000) == "generated"
    assert time.monotonic() - started < 2.0
    assert bytes_read_by_this_process() - before < 1_000_000


def test_dangling_link_and_fifo_are_unreadable(tmp_path):
    write(tmp_path / "ok.py")
    os.symlink(tmp_path / "gone.py", tmp_path / "dangling.py")
    os.mkfifo(tmp_path / "pipe.py")  # opening it would block: it must not be opened
    result = walk_roots([tmp_path])
    assert rels(result) == ["ok.py"] and skips(result) == {"unreadable": 2}
    assert classify_file(tmp_path, tmp_path / "pipe.py") == "unreadable"


def drop_file_permission_override() -> None:
    """In the child: as root, give up the capabilities that let root read any file."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def walk_in_child(root: Path, as_root: bool) -> dict:
    code = (
        "import json, sys; from pathlib import Path; from context.index.walk import walk_roots; "
        "r = walk_roots([Path(sys.argv[1])]); "
        "print(json.dumps({'files': [s.rel for s in r.files], 'skipped': dict(r.skipped)}))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code, str(root)],
        preexec_fn=drop_file_permission_override if as_root else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(completed.stdout)


@pytest.mark.skipif(sys.platform != "linux", reason="permission bits and capabilities as on Linux")
def test_permission_denied_is_unreadable(tmp_path):
    write(tmp_path / "ok.py")
    write(tmp_path / "locked.py").chmod(0)
    (write(tmp_path / "closed" / "inside.py").parent).chmod(0)
    try:
        # Root reads through permission bits; its child gives up that power, so the denial is real.
        outcome = walk_in_child(tmp_path, as_root=os.geteuid() == 0)
    except subprocess.CalledProcessError as error:
        if "prctl" in error.stderr:
            pytest.skip("cannot drop CAP_DAC_OVERRIDE here, so root is never denied")
        raise
    finally:
        (tmp_path / "closed").chmod(0o755)
    assert outcome == {"files": ["ok.py"], "skipped": {"unreadable": 2}}


def test_file_deleted_between_listing_and_reading(tmp_path, monkeypatch):
    write(tmp_path / "stays.py")
    write(tmp_path / "vanishes.py")
    write(tmp_path / "vanishes_late.py")
    real_candidates, real_read_head = walk._candidates, walk._read_head

    def listing_then_delete(root, nested, skipped):
        for path, rel in real_candidates(root, nested, skipped):
            if rel == "vanishes.py":
                os.remove(path)  # after git/scandir listed it, before it is looked at
            yield path, rel

    def stat_then_delete(path):
        if path.endswith("vanishes_late.py"):
            os.remove(path)  # after its stat, before its bytes are read
        return real_read_head(path)

    monkeypatch.setattr(walk, "_candidates", listing_then_delete)
    monkeypatch.setattr(walk, "_read_head", stat_then_delete)
    result = walk_roots([tmp_path])
    assert rels(result) == ["stays.py"] and skips(result) == {"unreadable": 2}


def test_git_listed_file_missing_on_disk_is_unreadable(tmp_path):
    repo = make_repo(tmp_path / "repo")
    write(repo / "kept.py")
    write(repo / "deleted.py")
    git(repo, "add", ".")
    (repo / "deleted.py").unlink()
    result = walk_roots([repo])
    assert rels(result) == ["kept.py"] and skips(result) == {"unreadable": 1}


def test_symlink_loops_are_not_followed(tmp_path):
    write(tmp_path / "pkg" / "mod.py")
    os.symlink("..", tmp_path / "pkg" / "up")  # a folder link to its own parent
    os.symlink(".", tmp_path / "pkg" / "here")
    os.symlink(tmp_path / "ping", tmp_path / "pong")  # two links pointing at each other
    os.symlink(tmp_path / "pong", tmp_path / "ping")
    started = time.monotonic()
    result = walk_roots([tmp_path])
    assert time.monotonic() - started < 5.0
    assert rels(result) == ["pkg/mod.py"]
    assert skips(result) == {"symlink_loop": 4}


def test_links_leaving_the_roots_are_skipped(tmp_path):
    outside = tmp_path / "outside"
    write(outside / "secret.py")
    root = tmp_path / "root"
    write(root / "main.py")
    os.symlink(outside, root / "linked_dir")
    os.symlink(outside / "secret.py", root / "linked_file.py")
    write(root / "lib" / "util.py")
    os.symlink(root / "lib", root / "lib_alias")  # stays inside: walked where it really is
    result = walk_roots([root])
    assert rels(result) == ["lib/util.py", "main.py"]
    assert skips(result) == {"symlink_loop": 2}
    assert classify_file(root, root / "linked_file.py") == "symlink_loop"
    # With the outside folder as a second root, the file link is fine (listed once).
    both = walk_roots([root, outside])
    assert sorted(rels(both)) == ["lib/util.py", "linked_file.py", "main.py"]
    assert skips(both) == {}  # and the folder link now points into a root: walked there


def test_links_in_a_git_repo_follow_the_same_rules(tmp_path):
    write(tmp_path / "outside.py")
    repo = make_repo(tmp_path / "repo")
    write(repo / "main.py")
    os.symlink(tmp_path / "outside.py", repo / "out.py")
    os.symlink("..", repo / "parent")
    os.symlink("main.py", repo / "alias.py")
    git(repo, "add", ".")
    result = walk_roots([repo])
    assert len(result.files) == 1 and result.files[0].rel in {"alias.py", "main.py"}
    assert skips(result) == {"symlink_loop": 2}


# ---------------------------------------------------------------- speed


def test_walking_the_standard_library_is_fast():
    started = time.monotonic()
    result = walk_roots([STDLIB])
    elapsed = time.monotonic() - started
    python_files = [source.rel for source in result.files if source.rel.endswith(".py")]
    assert len(python_files) > 1000
    assert {"json/decoder.py", "urllib/parse.py", "venv/__init__.py"} <= set(python_files)
    assert not any("site-packages/" in rel or "__pycache__" in rel for rel in python_files)
    assert Counter(result.skipped)["binary"] > 0
    assert elapsed < 2.0, f"walking the stdlib took {elapsed:.2f}s"


def test_nested_repositories_and_submodules_are_listed_with_their_own_ignores(tmp_path):
    library = make_repo(tmp_path / "library")
    write(library / "lib.py")
    write(library / ".gitignore", "generated.py\n")
    write(library / "generated.py")
    git(library, "add", "lib.py", ".gitignore")
    git(library, "commit", "-q", "-m", "lib")
    repo = make_repo(tmp_path / "repo")
    write(repo / "main.py")
    git(repo, "add", "main.py")
    git(repo, "commit", "-q", "-m", "main")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(library), "vendor/library")
    git(repo, "commit", "-q", "-m", "submodule")
    inner = make_repo(repo / "tools" / "inner")  # a clone nobody added: git lists it as one `tools/inner/`
    write(inner / "tool.py")
    write(inner / ".gitignore", "*.log\n")
    write(inner / "run.log", "noise\n")
    write(repo / "vendor" / "library" / "generated.py")  # ignored by the submodule's own .gitignore
    result = walk_roots([repo])
    assert rels(result) == [".gitmodules", "main.py", "tools/inner/.gitignore", "tools/inner/tool.py",
                            "vendor/library/.gitignore", "vendor/library/lib.py"]
    # A submodule that was never checked out is an empty folder: skipped, not an error.
    git(repo, "submodule", "deinit", "-q", "-f", "vendor/library")
    assert rels(walk_roots([repo])) == [".gitmodules", "main.py", "tools/inner/.gitignore",
                                        "tools/inner/tool.py"]
