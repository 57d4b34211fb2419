"""Synthetic microdata from DP measurements of a table's marginals: mst (MST) and mwem (MWEM)."""
