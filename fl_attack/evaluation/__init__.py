"""The evaluator: the only role that sees the ground truth, after the attack.

Holds the ground truth (victims), the scoring of every driver's attack outcomes (evaluator), the
paper's metrics (metrics), the verdict (verdict, its reader in reader, its statistics in stats, what its
data shares with a run's clients in overlap) and the pictures for humans (images). Imports the attacker,
the federation and the record's schema (fl_attack.schema), never the server's service (fl_attack.audit:
pyproject.toml's import-linter contracts); imported by the service, the entry points and analysis/.
"""
