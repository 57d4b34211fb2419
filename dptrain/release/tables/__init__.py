"""One-shot table releases: DP marginals over a declared domain, made consistent (marginals), and
Census-style TopDown on a geography (topdown)."""
