"""Privacy accounting: the ε a client has spent under local or central DP (accountant).

Imports nothing from fl_attack; fl_attack.run_config and the audit import it.
"""
