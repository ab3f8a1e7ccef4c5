"""Logic every backend shares: validation, shape inference, pooling, host streams, dispatch, and
the host kernel bodies (:mod:`.host_kernels`) with the CPU JIT that may accelerate them
(:mod:`.host_jit`)."""
