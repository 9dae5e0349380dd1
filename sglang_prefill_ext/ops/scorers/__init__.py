"""The scorers: what each query block's attention over the key blocks is estimated from.

antidiagonal.py (the default): antidiagonal sums of every row's packed QK^T; sampled.py: a few exact query
rows per block (also what the guard reads); pooled.py: mean Q and K per block, with its own threshold rule.
The first two give a mass that selection.py selects from.
"""
