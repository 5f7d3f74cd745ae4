"""Metrics of attention: `entropy` (how spread each query's attention is) and `qk` (how the mean
query and mean key align, per head and heads concatenated, and the pre-softmax scores).
`repgeom.metrics` exports their names."""
