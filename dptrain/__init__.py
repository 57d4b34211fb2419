"""dptrain: train models and release statistics under differential privacy."""

__version__ = "0.1.0"
