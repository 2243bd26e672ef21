"""A few cases of every class of tools/audit/run.py (so the audit cannot rot): each is
refused cleanly, and the audit says so in its counts."""

from __future__ import annotations

import json

from tools.audit import run


def test_a_quick_audit_finds_nothing_but_clean_refusals(capsys):
    status = run.main(["--quick", "--signals", "2", "--plans", "20", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["anything_else"] == [] and status == 0, report
    totals = report["totals"]
    assert totals["tried"] == (totals["refused cleanly"] + totals["read as a stream"]
                               + totals["ran as documented"]) >= 40
    assert set(report["classes"]) >= {"special files", "hostile metadata", "huge values",
                                      "outputs", "symlinks", "full disk", "usage errors",
                                      "mixed-type pickles", "non-string JSON", "empty paths",
                                      "output = input", "extreme numbers",
                                      "address-space limits", "signals", "fuzzed plans"}
