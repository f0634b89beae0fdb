"""Synthetic data sets for the recipes and tests: plain tensors, deterministic from a seed.

One module per topic (e.g. :mod:`recipes.data.spatial`); import the module you need.
This package is a leaf: it imports no model code, and this file imports no submodule.
"""
