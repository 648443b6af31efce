"""The audit's side: the service an honest-but-curious server feeds, and the evaluator behind it.

Holds the audit's settings (settings: AuditSettings, and RunSettings composing them with the
federation's), the Flower-free audit service (service), the ground truth (victims: only the
evaluator's), scoring (evaluator, metrics, verdict, reader, overlap), the run folder and its files
(runs, images, timings) and ``fl-attack replay`` (replay). Imports the attacker, the federation and
privacy; imported by fl_attack.run_config (preflight), the entry points (fl_attack.cli,
fl_attack.standalone) and the Flower app (strategies/).
"""
