"""Browsing a study: the optuna-dashboard launcher and the PETL-aware HTML/PNG report.

``petl-nas dashboard`` (`launcher.serve`) and ``petl-nas report`` (`report.write_report`) read any
study in SQL storage (SQLite or PostgreSQL URL). Matplotlib and optuna-dashboard are imported only
by the modules that need them (the ``dashboard`` extra).
"""

from ..core.describe import describe_config

__all__ = ["describe_config"]
