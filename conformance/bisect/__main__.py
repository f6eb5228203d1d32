"""``python -m conformance.bisect``: the command, and the step ``git bisect run`` calls back
(``step.STEP_FLAG``)."""

import sys

from conformance.bisect.cli import main

if __name__ == "__main__":
    sys.exit(main())
