#!/usr/bin/env python3
"""Prints, after a failed `ctest`, each failed test's failed assertions (Catch2's "FAILED:" blocks
and error lines), or the end of its output when it has none.

`ctest --output-on-failure` prints a failed test's output where the test ended, which in a long
parallel run is far from the end of the log; a reader (or a CI system that keeps only the log's
head and tail) then sees that a test failed but not why. This digest comes last.

Usage: failure-digest.py BUILD_DIR
"""
import os
import re
import sys

MAX_LINES_PER_TEST = 80
TAIL_LINES = 25
# Catch2's failure header, a fatal signal, a CMake script's error, a sanitizer's report.
MARKERS = re.compile(r"FAILED:|due to a fatal error|CMake Error|ERROR: \w+Sanitizer|"
                     r"Failed Required|\*\*\*Timeout|Assertion .* failed")


def outputs(log_path):
    """Yields (test name, output lines, failed) for each test in ctest's LastTest.log."""
    name, lines, inside, first = None, [], False, False
    with open(log_path, errors="replace") as log:
        for raw in log:
            line = raw.rstrip("\n")
            header = re.match(r"^\d+/\d+ Test: (.+)$", line)
            if header:
                name, lines, inside = header.group(1), [], False
            elif line.startswith("Output:") and name:
                inside, first = True, True
            elif line == "<end of output>":
                inside = False
            elif inside and first and re.match(r"^-+$", line):
                first = False  # ctest's own rule under "Output:", not the test's
            elif line.startswith("Test Failed") or line.startswith("Test Passed"):
                if name:
                    yield name, lines, line.startswith("Test Failed")
                name = None
            elif inside:
                first = False
                lines.append(line)


def digest(lines):
    """The failure blocks of one test's output: each marker line and what follows it up to the
    next blank line (Catch2 ends each block with one), at most MAX_LINES_PER_TEST lines."""
    picked, i, case, shown = [], 0, None, None
    rule = re.compile(r"^-{20,}$")
    while i < len(lines) and len(picked) < MAX_LINES_PER_TEST:
        # Catch2 names each test case between two rules of dashes.
        if rule.match(lines[i]) and i + 2 < len(lines) and rule.match(lines[i + 2]):
            case = lines[i + 1]
            i += 3
            continue
        if MARKERS.search(lines[i]):
            if case and case != shown:
                picked.append(f"[{case}]")
                shown = case
            start = max(0, i - 1)
            end = i + 1
            while end < len(lines) and lines[end].strip() and end - start < 30:
                end += 1
            picked.extend(lines[start:end] + [""])
            i = end
        else:
            i += 1
    return picked[:MAX_LINES_PER_TEST] or [l for l in lines[-TAIL_LINES:] if not rule.match(l)]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: failure-digest.py BUILD_DIR")
    log_path = os.path.join(sys.argv[1], "Testing", "Temporary", "LastTest.log")
    if not os.path.exists(log_path):
        sys.exit(f"failure-digest: no {log_path}")
    failed = [(name, lines) for name, lines, bad in outputs(log_path) if bad]
    if not failed:
        return
    print(f"\n==== why {len(failed)} test(s) failed (from {log_path}) ====")
    for name, lines in failed:
        print(f"\n---- {name} ----")
        print("\n".join(digest(lines)))


if __name__ == "__main__":
    main()
