"""Runs test_dataloader.py's tests in this process, one at a time, appending "<id> <outcome>" to
the results file as each ends. A test that runs past --timeout is recorded as TIMEOUT and this
process ends at once (a hung loader cannot be stopped from inside); run.py then starts a new
runner for the rest. Tests already in the results file are skipped."""
import argparse
import os
import sys
import threading
import unittest


def tests(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from tests(t)
        else:
            yield t


class Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcome = "ok"

    def addFailure(self, test, err):  # noqa: N802
        super().addFailure(test, err)
        self.outcome = "FAIL"
        sys.stderr.write(self.failures[-1][1])

    def addError(self, test, err):  # noqa: N802
        super().addError(test, err)
        self.outcome = "ERROR"
        sys.stderr.write(self.errors[-1][1])

    def addSkip(self, test, reason):  # noqa: N802
        self.outcome = "skipped"

    def addExpectedFailure(self, test, err):  # noqa: N802
        self.outcome = "expected_failure"

    def addUnexpectedSuccess(self, test):  # noqa: N802
        self.outcome = "unexpected_success"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", required=True)
    parser.add_argument("--timeout", type=float, default=120)
    args, rest = parser.parse_known_args()
    sys.argv = [sys.argv[0]] + rest  # torch's common_utils parses the command line at import
    done = set()
    if os.path.exists(args.results):
        with open(args.results) as f:
            done = {line.split()[0] for line in f if line.strip()}
    out = open(args.results, "a", buffering=1)
    sys.path.insert(0, os.getcwd())  # the extracted test file is in the working folder
    import test_dataloader
    # torch's load_tests hook insists that the tests run from their own script; the tests
    # themselves do not care.
    if hasattr(test_dataloader, "load_tests"):
        del test_dataloader.load_tests
    for test in tests(unittest.TestLoader().loadTestsFromModule(test_dataloader)):
        name = test.id().replace("test_dataloader.", "")
        if name in done:
            continue
        sys.stderr.write(f"== {name}\n")
        out.write(f"{name} CRASH\n")  # replaced when the test ends; stays if the process dies

        def expire(name=name):
            out.write(f"{name} TIMEOUT\n")
            out.flush()
            os._exit(3)

        timer = threading.Timer(args.timeout, expire)
        timer.daemon = True
        timer.start()
        result = Result()
        test.run(result)
        timer.cancel()
        out.write(f"{name} {result.outcome}\n")
    out.close()
    os._exit(0)  # not the interpreter's exit: a loader's leftover threads must not hold it


# Guarded: tests that start processes with the "spawn" method import this script again.
if __name__ == "__main__":
    main()
