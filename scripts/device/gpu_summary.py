"""Summarise a GPU test run's JUnit XML with what it ran on: counts, failures, the kernel sources'
hash, commit, GPU, torch and triton. tests/test_gpu_results.py checks the committed summary against
the current kernel sources.
Usage: PYTHONPATH=src python3 scripts/device/gpu_summary.py JUNIT.xml SUMMARY.json "COMMAND" [PYTEST_EXIT]
PYTEST_EXIT: the test command's exit status; any but 0 and 1 (124: `timeout` stopped pytest at its
limit; 2: pytest interrupted) marks the run "interrupted", which tests/test_gpu_results.py refuses.
"""

import json
import sys
from pathlib import Path
import xml.etree.ElementTree as ET

import torch

from lenx.runinfo import environment, kernel_sources_hash


def summarise(junit_path: str, command: str, exit_status: str = "") -> dict:
    root = ET.parse(junit_path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for s in suites for c in s.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    env = environment(torch.device("cuda") if torch.cuda.is_available() else None)
    env["command"] = command
    return {"kernel_sources_hash": kernel_sources_hash(), **counts,
            "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed_tests": failed, "pytest_exit": exit_status,
            "interrupted": exit_status not in ("", "0", "1"), "environment": env}


if __name__ == "__main__":
    if not Path(sys.argv[1]).is_file():
        sys.exit(f"error: no JUnit file {sys.argv[1]}: pytest did not get to write it")
    summary = summarise(sys.argv[1], sys.argv[3] if len(sys.argv) > 3 else "", sys.argv[4] if len(sys.argv) > 4 else "")
    with open(sys.argv[2], "w") as f:
        json.dump(summary, f, indent=1)
    print({k: summary[k] for k in ("tests", "passed", "failures", "errors", "skipped", "interrupted")})
