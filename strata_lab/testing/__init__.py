"""Hypothesis strategies for property tests of tokenizer boundaries and agent sessions."""
