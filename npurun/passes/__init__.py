"""Compiler passes: one per file, Graph -> Graph (issue D builds the pipeline)."""
