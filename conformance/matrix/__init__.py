"""The matrix: cells (points of it, named so that a pytest id spells every axis), the
profiles that choose which cells a run covers, and what a cell plans to do at setup.

Shared vocabulary of every side of the kit. It reads the axis registries in ``fixtures/``
without importing Thunder (they import it only when a rank builds a cell).
"""
