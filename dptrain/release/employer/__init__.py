"""Employer-employee count statistics under (alpha, epsilon)-ER-EE privacy (issue 34)."""
