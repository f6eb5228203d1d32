"""Git plumbing on the Thunder checkout: both ends resolved to commits (or BadInput), a
commit's tree exported apart from the user's working tree, the first bad commit read from
the bisect log."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path


class BadInput(Exception):
    """Input the bisect cannot start from; one line, exit status 4."""


def run(repo: Path, *args: str, check: bool = True) -> str:
    """``git -C repo *args``'s output, stripped; CalledProcessError on failure when ``check``."""
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, ["git", *args], proc.stdout, proc.stderr)
    return proc.stdout.strip()


def resolve(repo_arg: Path, good: str, bad: str) -> tuple[Path, str, str]:
    """The checkout's root and both revisions as full hashes, or BadInput."""
    if not repo_arg.is_dir():
        raise BadInput(f"--thunder-repo {repo_arg}: no such directory")
    try:
        repo = Path(run(repo_arg, "rev-parse", "--show-toplevel"))
    except subprocess.CalledProcessError:
        raise BadInput(f"--thunder-repo {repo_arg}: not a git repository") from None
    hashes = []
    for flag, rev in (("--good", good), ("--bad", bad)):
        try:
            hashes.append(run(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"))
        except subprocess.CalledProcessError:
            raise BadInput(f"{flag} {rev}: no such commit in {repo}") from None
    if (repo / run(repo, "rev-parse", "--git-path", "BISECT_START")).exists():  # relative to repo, or absolute
        raise BadInput(f"{repo} is in the middle of a git bisect already: finish it (git bisect reset) first")
    if run(repo, "status", "--porcelain", "--untracked-files=no"):
        raise BadInput(f"{repo} has uncommitted changes: git bisect would check out over them")
    return repo, hashes[0], hashes[1]


def export(repo: Path, commit: str, into: Path) -> Path:
    """The tree of ``commit`` in a folder of its own: the premise is checked without touching
    the user's working tree."""
    if not run(repo, "ls-tree", commit):  # an empty tree: tarfile cannot read its archive
        return into
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout), mode="r:") as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12: refuse members escaping the folder
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)
    return into


def first_bad(log: str) -> str | None:
    """The first bad commit ``git bisect log`` names, or None while it names none."""
    for line in log.splitlines():
        if line.startswith("# first bad commit: ["):
            return line.removeprefix("# first bad commit: [").partition("]")[0]
    return None
