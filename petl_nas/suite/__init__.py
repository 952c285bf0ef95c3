"""Suites: one protocol over several tasks and budgets, its studies, and the table that judges the
search against the best baseline built for each budget (`config`, `runner`, `cells`)."""
