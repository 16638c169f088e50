"""`vaiq` and `python3 -m vaiq`: the command-line tool, with the arguments given."""

import os
import sys
from pathlib import Path


def command():
    """The vaiq executable that belongs to this package: inside it (the wheel),
    in the prefix it was installed into (cmake --install), or in the build tree."""
    package = Path(__file__).resolve().parent
    up = package.parents
    candidates = [package / "bin" / "vaiq"] + [up[i] / "bin" / "vaiq" for i in (3, 1) if i < len(up)]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError("the vaiq command is not installed beside the package; looked in "
                            + ", ".join(str(c) for c in candidates))


def main():
    executable = command()
    os.execv(executable, [str(executable)] + sys.argv[1:])


if __name__ == "__main__":
    main()
