"""Notebooks and reports: ``Outputs`` (inside a notebook), ``figures``, ``render`` (coloured
token HTML), ``runner`` (``specbench report``: the notebooks through papermill), ``index`` (the
report's index page) and ``explorer`` (interactive widgets)."""

from specbench.report.outputs import Outputs

__all__ = ["Outputs"]
