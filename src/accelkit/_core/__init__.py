"""Logic every backend shares: validation, shape inference, pooling, host streams, dispatch."""
