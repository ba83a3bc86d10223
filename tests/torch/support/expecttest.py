"""Stand-in for the expecttest package, which Debian does not ship but torch's test helpers
import (torch.testing._internal.common_utils). The distributed tests use none of its features."""

import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 (torch's name)
        self.assertEqual(str(actual).strip(), str(expect).strip())
