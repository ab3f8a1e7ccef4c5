"""The conformance suite: one body of tests run against every backend.

A plugin passes when every test here passes for it; tests skip (with a reason) the dtypes and
operations that the backend's capabilities do not claim.
"""
