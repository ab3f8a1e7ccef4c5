"""Helpers of the test tooling (not tests): :mod:`support.parts` runs the suite in parts."""
