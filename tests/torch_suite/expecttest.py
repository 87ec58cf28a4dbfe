"""A stand-in for the `expecttest` package, which torch's test utilities import and Debian 12
does not ship (and there is no PyPI here). torch's DataLoader tests use none of its inline
expectation machinery; this gives common_utils what it reads at import."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 (its name)
        self.assertEqual(actual, expect)
