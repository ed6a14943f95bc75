"""A benchmark's reports as files: the JSON of one run (`engine.bench --json`'s keys) and the CSV of every run.

Why a module: the CSV flattens the bench's nested report the same way for the tab's download and
`/benchmark`'s answer: one row per run, one column per figure, nested figures as dotted columns.
"""

from __future__ import annotations

import csv
import io


def flat_row(report: dict) -> dict:
    """A report's scalar figures for one CSV row; nested dicts (workload, config) become dotted columns. Printable
    multi-line sections (the roofline's text) stay in the JSON."""
    row = {}
    for key, value in report.items():
        if isinstance(value, dict):
            row.update({f"{key}.{k}": v for k, v in value.items() if not isinstance(v, dict | list)})
        elif not isinstance(value, list) and not (isinstance(value, str) and "\n" in value):
            row[key] = value
    return row


def runs_csv(reports: list[dict]) -> str:
    """Reports as CSV: one row per run, one column per figure (the bench's key names)."""
    rows = [flat_row(report) for report in reports]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
