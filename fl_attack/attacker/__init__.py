"""The attacker's side: what runs on an attack worker, from the observed update alone.

Holds the attacks (attacks/: PI-SME, NL-SME, SME, IG, GI-NAS, DGGI), their entry points
(api: reconstruct, reconstruct_batch), the quadrature, label recovery, the server's memory, the
diffusion prior, the arithmetic precision and the workers that run attack jobs. Imports
fl_attack.federation, fl_attack.paths and fl_attack.records only: never the ground truth or its
scoring (fl_attack.evaluation; the layers contract in pyproject.toml checks it). fl_attack.audit,
fl_attack.evaluation and the entry points import it.
"""
