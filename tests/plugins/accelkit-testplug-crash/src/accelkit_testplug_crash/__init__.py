"""accelkit-testplug-crash: a backend that loads and lists a device, then fails the way a broken
driver does, made for the tests of ``accelkit doctor``'s self-test.

It drives one device, ``crash:0``, with the CPU backend's kernels, except ``matmul``, which
misbehaves as ``ACCELKIT_TESTPLUG_CRASH`` says (read at each call):

- ``abort`` (the default): print a compiler-style fatal error on stderr and ``os.abort()``, as
  PoCL's LLVM does on a kernel it cannot compile;
- ``hang``: sleep for an hour (for timeouts);
- ``slow``: sleep for 2.5 s, then compute correctly (a slow first compile, say);
- ``wrong``: return the right shape with wrong numbers;
- ``raise``: raise ``DeviceError``;
- ``exit``: compute correctly, but abort the process when the interpreter exits;
- ``none``: behave.
"""
