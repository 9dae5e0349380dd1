"""Sparse vs dense: next-token predictions and passkey answers of a real model."""
