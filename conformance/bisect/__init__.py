"""``python -m conformance.bisect``: the first Thunder commit at which one cell stops
conforming, found with ``git bisect run`` in a Thunder checkout.

- ``cli``: the command: its arguments, the premise at both ends, the bisect and its answer;
- ``git``: git plumbing on the checkout: revisions resolved, a commit's tree exported, the
  first bad commit read from the bisect log;
- ``step``: one step of ``git bisect run`` (the command calls itself back with ``STEP_FLAG``):
  the suite run against the checkout's Thunder;
- ``verdict``: a step's report.json read as git bisect's good, bad or skip.

The package imports nothing else of the kit: it talks to the suite as a user does, through
pytest's command line and report.json (tests/unit/test_layout.py holds it to that).
"""
