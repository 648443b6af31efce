"""The audit's server side: the service an honest-but-curious server feeds, without Flower.

Holds the audit's settings (settings: AuditSettings, and RunSettings composing them with the
federation's), the Flower-free audit service (service), the run folder it writes (run_folder; the
files' and columns' schema is fl_attack.schema), where the time went (timings) and ``fl-attack replay``
(replay). Scores with the evaluator (fl_attack.evaluation), which never imports it. Imports the
evaluation, the attacker, the federation and privacy; imported by fl_attack.run_config (preflight), the
entry points (fl_attack.cli, fl_attack.standalone) and the Flower app (strategies/).
"""
