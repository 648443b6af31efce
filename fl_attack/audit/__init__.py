"""The audit's side: the service an honest-but-curious server feeds, and the evaluator behind it.

Holds the Flower-free audit service (service), the ground truth (victims: only the evaluator's),
scoring (evaluator, metrics, verdict, reader, overlap), the run folder and its files (runs, images,
timings) and ``fl-attack replay`` (replay). Imports the attacker, the federation, privacy and
fl_attack.run_config; imported by the entry points (fl_attack.cli, fl_attack.standalone) and the
Flower app (strategies/, clients/).
"""
