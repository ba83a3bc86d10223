#!/usr/bin/env python3
"""cmake/failure-digest.py on a ctest log written here: a passed test is left out, a Catch2
failure is shown with its test case and expansion, a test without a marker by the end of its
output. Usage: failure_digest_test.py DIGEST_SCRIPT WORK_DIR"""
import os
import subprocess
import sys

LOG = """\
1/3 Testing: good
1/3 Test: good
Command: "/bin/true"
Output:
----------------------------------------------------------
all fine FAILED: in a passed test is not shown
<end of output>
Test time =   0.01 sec
----------------------------------------------------------
Test Passed.
"good" end time: Nov 30 12:00 UTC

2/3 Testing: serving_test
2/3 Test: serving_test
Command: "serving_test"
Output:
----------------------------------------------------------
served 8 plan s measured
-------------------------------------------------------------------------------
Daronpon moves load off a slower worker
-------------------------------------------------------------------------------
/src/serve_test.cpp:488
...............................................................................

/src/serve_test.cpp:520: FAILED:
  CHECK( daronpon.latency_p99_ms < shares.latency_p99_ms )
with expansion:
  52.1 < 49.1
with message:
  p99 shares 49.1 ms, Daronpon 52.1 ms

===============================================================================
test cases: 20 | 19 passed | 1 failed
<end of output>
Test time =  56.93 sec
----------------------------------------------------------
Test Failed.
"serving_test" end time: Nov 30 12:01 UTC

3/3 Testing: crash
3/3 Test: crash
Command: "crash"
Output:
----------------------------------------------------------
started
last words
<end of output>
Test time =   0.02 sec
----------------------------------------------------------
Test Failed.
"crash" end time: Nov 30 12:01 UTC
"""


def main():
    digest, work = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.join(work, "Testing", "Temporary"), exist_ok=True)
    with open(os.path.join(work, "Testing", "Temporary", "LastTest.log"), "w") as log:
        log.write(LOG)
    out = subprocess.run([sys.executable, digest, work], capture_output=True, text=True,
                         check=True).stdout
    problems = []
    for want in ["why 2 test(s) failed", "---- serving_test ----",
                 "[Daronpon moves load off a slower worker]", "serve_test.cpp:520: FAILED:",
                 "52.1 < 49.1", "p99 shares 49.1 ms", "---- crash ----", "last words"]:
        if want not in out:
            problems.append(f"missing {want!r}")
    for unwanted in ["---- good ----", "in a passed test", "served 8 plan s", "test cases: 20"]:
        if unwanted in out:
            problems.append(f"unexpected {unwanted!r}")
    if problems:
        sys.exit("failure-digest: " + "; ".join(problems) + "\n--- output ---\n" + out)
    print("failure-digest: ok")


if __name__ == "__main__":
    main()
