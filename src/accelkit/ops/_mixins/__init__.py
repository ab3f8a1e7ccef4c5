"""The TensorOps interface, split by concern; each part validates once and calls kernel hooks."""
