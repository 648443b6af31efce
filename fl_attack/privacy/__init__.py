"""Privacy accounting: the ε a client has spent under local or central DP (accountant).

Imports nothing from fl_attack; the federation's settings (DefenseSettings) and the audit import it.
"""
