"""Sample outputs in the README and the tutorial, checked against real runs.

A sample is a fenced block right after a marker line naming it::

    <!-- sample: status-readme -->
    ```
    $ celery -A proj fair status
    queue celery: ...
    ```

A test produces the same text by a real run (see tests/test_samples.py, test_tutorial.py
and test_demo.py) and calls :func:`check_sample`, which compares it with the block after
:func:`normalize` (only what legitimately varies: ids, durations, ports, timestamps).

To regenerate every sample from real runs after an output change, run the sample tests
with ``CELERY_FAIR_UPDATE_SAMPLES=1``: each rewrites its block with the real output
instead of comparing (see the one-liner in tests/test_samples.py). Review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
#: The documents whose samples are checked.
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "tutorial.md", ROOT / "docs" / "policies.md")
UPDATE_ENV = "CELERY_FAIR_UPDATE_SAMPLES"
MARKER = re.compile(r"^<!-- sample: ([\w-]+) -->\n(```[^\n]*\n)(.*?)^```", re.M | re.S)

#: What legitimately differs between runs, and what the docs show instead.
#: A live dispatcher's host and pid (``fair status``), shown as fixed values like the ids.
DISPATCHER, SHOWN_DISPATCHER = re.compile(r"dispatcher \S+ pid \d+"), "dispatcher web-1 pid 4242"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SHOWN_ID = "f61c5ac7-..."
#: What a CLI sample is compared on: its text with waits and ages (``0.4s``, ``12 ms``,
#: ``3m``), time stamps and the column widths they cause all made alike; counts, groups,
#: columns and words stay exact.
DURATION = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|sec|min|m|h|d)\b")
TIMESTAMP = re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?"
                       r"(?:Z|[+-]\d\d:?\d\d)?")


def cli_shape(text: str) -> str:
    text = TIMESTAMP.sub("<time>", DURATION.sub("<duration>", text))
    return re.sub(r"([ ─━-])\1+", r"\1", text)


def updating() -> bool:
    return os.environ.get(UPDATE_ENV) == "1"


def samples() -> dict[str, tuple[Path, str]]:
    """Every marked sample: name -> (document, the block's text)."""
    found: dict[str, tuple[Path, str]] = {}
    for doc in DOCUMENTS:
        for match in MARKER.finditer(doc.read_text(encoding="utf-8")):
            assert match.group(1) not in found, f"sample {match.group(1)!r} marked twice"
            found[match.group(1)] = (doc, match.group(3))
    return found


def normalize(text: str) -> str:
    """Task ids shown as ``f61c5ac7-...``, trailing spaces dropped, one final newline.
    (An output that comes to show something else that varies, a host name or a pid, needs
    its rule here, shown as a fixed value like the ids.)"""
    text = UUID.sub(SHOWN_ID, text)
    text = DISPATCHER.sub(SHOWN_DISPATCHER, text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def rewrite(name: str, text: str) -> None:
    doc, _ = samples()[name]
    content = doc.read_text(encoding="utf-8")

    def replace(match: re.Match[str]) -> str:
        if match.group(1) != name:
            return match.group(0)
        return f"<!-- sample: {name} -->\n{match.group(2)}{text}```"

    doc.write_text(MARKER.sub(replace, content), encoding="utf-8")


def check_sample(name: str, real: str,
                 shape: Callable[[str], str] = lambda text: text) -> None:
    """Compare the real output with sample ``name`` (both normalized, then passed through
    ``shape``, which may reduce them further to what must not change: e.g. the demo's
    table without its timings); or, in update mode, write the real output into the
    document."""
    assert name in samples(), f"no block marked <!-- sample: {name} --> in {DOCUMENTS}"
    real = normalize(real)
    if updating():
        rewrite(name, real)
        return
    shown = normalize(samples()[name][1])
    assert shape(real) == shape(shown), (
        f"sample {name!r} differs from the real output (regenerate the samples with "
        f"{UPDATE_ENV}=1, see tests/test_samples.py):\n--- shown ---\n{shown}"
        f"--- real ---\n{real}")
