"""kbench: pack kernel sources into a leaderboard submission.py and judge it locally the way the leaderboard does.

Installed, the repository's rooms live under this one import name: ``kbench.cli``, ``kbench.generator``,
``kbench.problems``, ``kbench.evaluator``, ``kbench.benchlib``, with ``kernels/`` and ``templates/`` as package data.
"""
__version__ = "0.2.0"
