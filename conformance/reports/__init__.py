"""Reports of a run, written in the pytest process from pytest's own reports: report.jsonl
as each item finishes, report.json, summary.md, memory.png and scale.png at the end. They
receive plain values (``SessionInfo``), never the front end's runner."""
