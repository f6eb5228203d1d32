"""tox's ``install_command``: ``pip install`` that, where pip fails, ends with one line naming
what did not install and why, and exits with status 4.

Without it tox ends a failed install with pip's status, 1: the status of a suite in which
some cell does not conform, so a THUNDER_SPEC or TORCH_SPEC that does not install would read,
to CI, as a non-conformance of the Thunder under test. 4 is pytest's usage error, the status
the suite gives every other bad input. pip's own output passes through unchanged (it is the
evidence: a resolver conflict, a git URL that does not clone); the line comes last.

Standard library only: it runs in tox's fresh virtualenv before anything is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys

USAGE_ERROR = 4  # pytest.ExitCode.USAGE_ERROR (pytest is not installed yet when this runs)
SPECS = ("THUNDER_SPEC", "TORCH_SPEC")  # the environment variables tox.ini installs from


def _is(package: str, spec: str) -> bool:
    # tox hands a spec that looks like a path over as one: "dir" becomes "./dir"
    return package == spec or os.path.abspath(package) == os.path.abspath(spec)


def summary(packages: list[str], reason: str | None) -> str:
    """The one line: the specs among ``packages`` (else the packages), and pip's last error."""
    given = {name: os.environ[name] for name in SPECS if os.environ.get(name)}
    named = [f"{name}={spec!r}" for name, spec in given.items() if any(_is(p, spec) for p in packages)]
    what = ", ".join(named) or " ".join(packages)
    return f"ERROR: pip could not install {what}: {reason or 'see pip output above'}"


def main(argv: list[str]) -> int:
    process = subprocess.Popen(
        [sys.executable, "-m", "pip", "install", *argv], stderr=subprocess.PIPE, text=True, errors="replace"
    )
    assert process.stderr is not None
    last_error = None
    try:
        for line in process.stderr:  # streamed through, so a long install still shows progress
            sys.stderr.write(line)
            if line.startswith("ERROR: "):
                last_error = line.removeprefix("ERROR: ").strip()
    except KeyboardInterrupt:  # pip got the signal too (same process group): no line of ours
        return process.wait()
    if process.wait() == 0:
        return 0
    sys.stderr.flush()
    packages = [a for a in argv if not a.startswith("-")]
    print(summary(packages, last_error), file=sys.stderr, flush=True)
    return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
